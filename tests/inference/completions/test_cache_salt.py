"""The cache salt rule (inference/completions/cache_salt.py): /v1 callers share cached prompts only
with themselves, a client's salt only narrows, the town's runs are out of every caller's reach; and,
end to end through daphne and a real worker, a second identity sees none of the first one's
cache while the first sees its own."""

from __future__ import annotations

import uuid

from rest_framework.authtoken.models import Token

from inference.completions.cache_salt import run_cache_salt, v1_cache_salt
from tests.inference.test_openai_api import LONG_QUESTION, MODEL


def test_identities_get_different_salts_and_a_client_salt_only_narrows():
    rin, kenji = "user:1", "user:2"
    assert v1_cache_salt(identity=rin, client_salt=None) != v1_cache_salt(
        identity=kenji, client_salt=None
    )
    # The same client salt from two identities: still two namespaces.
    assert v1_cache_salt(identity=rin, client_salt="team") != v1_cache_salt(
        identity=kenji, client_salt="team"
    )
    # A client salt narrows within the identity.
    assert v1_cache_salt(identity=rin, client_salt="team") != v1_cache_salt(
        identity=rin, client_salt=None
    )
    assert v1_cache_salt(identity=rin, client_salt="a") == v1_cache_salt(
        identity=rin, client_salt="a"
    )
    # Anonymous callers share one namespace, apart from every identity's.
    anonymous = v1_cache_salt(identity=None, client_salt=None)
    assert anonymous == v1_cache_salt(identity=None, client_salt=None)
    assert anonymous != v1_cache_salt(identity=rin, client_salt=None)


def test_the_town_namespace_is_out_of_reach_and_not_guessable(settings):
    town = run_cache_salt(7)
    assert town.startswith("town:") and len(town) == len("town:") + 32
    assert town != run_cache_salt(8)
    for identity in (None, "user:1", "access:rin@example.com"):
        for client in (None, town, "run-7", "town:" + town):
            assert v1_cache_salt(identity=identity, client_salt=client).startswith("v1:")
    old_key = settings.SECRET_KEY
    settings.SECRET_KEY = old_key + "-rotated"
    assert run_cache_salt(7) != town  # derived under the site's key


def test_sharing_across_identities_is_an_explicit_setting(settings):
    assert v1_cache_salt(identity="user:1", client_salt=None) != v1_cache_salt(
        identity="user:2", client_salt=None
    )
    settings.V1_SHARED_CACHE = True
    assert v1_cache_salt(identity="user:1", client_salt=None) == v1_cache_salt(
        identity="user:2", client_salt=None
    )
    assert not v1_cache_salt(identity="user:1", client_salt=None).startswith("town:")


def test_a_second_identity_sees_none_of_the_first_ones_cache(openai_server, django_user_model):
    import openai

    base_url, _worker = openai_server
    keys = [
        Token.objects.create(user=django_user_model.objects.create_user(name)).key
        for name in ("rin", "kenji")
    ]
    rin, kenji = (
        openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120) for key in keys
    )
    # A prompt no earlier test sent, so nothing of it is cached before.
    messages = [{"role": "user", "content": f"{uuid.uuid4().hex} {LONG_QUESTION}"}]

    def cached(client, **extra) -> int:
        answer = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=2, temperature=0, **extra
        )
        assert answer.usage.prompt_tokens > 64
        return answer.usage.prompt_tokens_details.cached_tokens

    assert cached(rin) == 0
    assert cached(kenji) == 0  # the same prompt, another identity: nothing shared
    assert cached(rin) > 64  # its own cache
    # A client salt narrows: Rin's own prompt under a salt is a namespace of its own.
    assert cached(rin, extra_body={"cache_salt": "draft"}) == 0
    assert cached(kenji, extra_body={"cache_salt": "draft"}) == 0  # not Rin's "draft"
