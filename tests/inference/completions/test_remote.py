"""The town pointed at an external OpenAI-compatible server: here our own /v1, served live by
daphne with a real engine worker behind it (tests/inference/conftest.py's module_openai_server:
one for the file) — first completion_generate in this process, then a whole tick whose decisions
run on a second worker that loads no engine and sends every prompt to that server."""

from __future__ import annotations

import json
import socket

import jsonschema
import pytest

from inference.completions.remote import RemoteServerError
from inference.errors import CompletionInputError
from inference.services import Completion, CompletionRequest, completion_generate, completion_model
from town import services
from town.demo import demo_town_create
from town.models import Decision, Tick
from town.services.decisions import decision_parse
from town.simulation import tick_run
from town.tasks import decision_send

MODEL = "smollm2-tiny-random"
MESSAGES = [
    {"role": "system", "content": "You live in Pokomachi, a small town. " * 12},
    {"role": "user", "content": "It is morning. Where do you go?"},
]
SCHEMA = {
    "type": "object",
    "properties": {
        "place": {"enum": ["bakery", "park"]},
        "minutes": {"type": "integer", "minimum": 1, "maximum": 90},
    },
    "required": ["place", "minutes"],
    "additionalProperties": False,
}


def _generate(*, on_text=None, **request) -> Completion:
    return completion_generate(request=CompletionRequest(**request), on_text=on_text)


@pytest.fixture
def remote(module_openai_server, transactional_db, settings):
    # One server for the file: its tests only send requests (each under its own cache salt or run).
    base_url, worker = module_openai_server
    settings.INFERENCE_OPENAI = {"base_url": base_url, "model": MODEL, "api_key": ""}
    return base_url, worker


def test_completions_come_from_the_server_with_its_tokens_and_timings(remote):
    assert completion_model() == MODEL
    first = _generate(messages=MESSAGES, json_schema=None, max_tokens=8, cache_salt="a")
    pieces: list[str] = []
    second = _generate(
        messages=MESSAGES, json_schema=None, max_tokens=8, cache_salt="a", on_text=pieces.append
    )
    assert second.text == first.text and "".join(pieces) == second.text  # greedy, streamed
    assert second.token_ids == []  # an OpenAI server does not send them
    m = second.metrics
    assert m.backend == f"openai:{remote[0]}"
    assert m.num_prompt_tokens == second.num_prompt_tokens > 64
    assert 1 <= m.num_output_tokens <= 8
    # usage.prompt_tokens_details.cached_tokens became the decision's cached tokens.
    # (token-exact reuse: the same prompt again reuses all but its last token)
    assert m.num_cached_tokens == m.num_prompt_tokens - 1
    # Our /v1 reports the engine's own timings; the client's view is kept beside them.
    for name in ("queue_s", "prefill_s", "decode_s", "ttft_s", "e2e_s"):
        assert isinstance(getattr(m, name), float) and getattr(m, name) >= 0, name
    assert m.client_e2e_s >= m.e2e_s and m.client_ttft_s >= m.ttft_s
    # A different salt shares nothing with the first two.
    other = _generate(messages=MESSAGES, json_schema=None, max_tokens=2, cache_salt="b")
    assert other.metrics.num_cached_tokens == 0

    structured = _generate(messages=MESSAGES, json_schema=SCHEMA, max_tokens=60)
    jsonschema.validate(json.loads(structured.text), SCHEMA)


def test_refusals_and_a_dead_server_are_clear_errors(remote, settings):
    with pytest.raises(CompletionInputError, match=r"refused the request: .*context"):
        _generate(
            messages=[{"role": "user", "content": "melon pan " * 6000}],
            json_schema=None,
            max_tokens=4,
        )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    settings.INFERENCE_OPENAI = {
        **settings.INFERENCE_OPENAI,
        "base_url": f"http://127.0.0.1:{port}/v1",
    }
    with pytest.raises(RemoteServerError, match=f"no answer from http://127.0.0.1:{port}/v1"):
        _generate(messages=MESSAGES, json_schema=None, max_tokens=2)


def test_a_tick_decided_by_the_external_server(remote, celery_worker_process):
    base_url, engine_worker = remote
    town_worker = celery_worker_process(
        env={"POKOMACHI_OPENAI_BASE_URL": base_url, "POKOMACHI_OPENAI_MODEL": MODEL}
    )
    assert "loads no engine" in town_worker.output()
    # Five of the ten residents: one more than the run's concurrency (4), so a decision starts
    # after others have computed the shared head; the whole town took twice as long.
    run = services.run_create(
        town=demo_town_create(seed=0), nodes=[town_worker.queue], num_residents=5
    )
    run = services.run_start(run=run)
    tick = tick_run(run_id=run.pk, send=decision_send, owner="test", poll_s=0.05)
    assert tick.status == Tick.Status.DONE
    decisions = list(run.decisions.all())
    assert len(decisions) == 5
    for d in decisions:
        value, error = decision_parse(decision=d)  # the server honoured the JSON schema
        assert d.status == Decision.Status.APPLIED and value is not None, (error, d.raw_output)
        assert d.worker == town_worker.hostname and d.output_token_ids == []
        assert d.metrics["backend"] == f"openai:{base_url}"
        assert d.num_prompt_tokens > 800 and d.num_output_tokens > 5
        assert d.queue_s >= 0 and d.prefill_s > 0 and d.ttft_s > 0 and d.engine_e2e_s > 0
    # The shared head was reused on the server, and the decision says so.
    assert sum(d.num_cached_tokens for d in decisions) > 0
    assert engine_worker.is_alive()


def test_a_server_without_per_request_timings_gets_the_clients(settings):
    # vLLM's usage: token counts and cached tokens, no per-request timings.
    from openai.types import CompletionUsage

    from inference.completions.remote import _metrics

    settings.INFERENCE_OPENAI = {"base_url": "http://gpu1:8000/v1", "model": "m", "api_key": ""}
    usage = CompletionUsage.model_validate(
        {
            "prompt_tokens": 1700,
            "completion_tokens": 40,
            "total_tokens": 1740,
            "prompt_tokens_details": {"cached_tokens": 1536},
        }
    )
    m = _metrics(usage, {}, {"ttft_s": 0.4, "e2e_s": 2.4, "decode_s": 2.0})
    assert (m.num_prompt_tokens, m.num_cached_tokens, m.num_output_tokens) == (
        1700,
        1536,
        40,
    )
    assert (m.ttft_s, m.e2e_s, m.decode_s) == (0.4, 2.4, 2.0)
    assert m.queue_s is None and m.prefill_s is None
    assert m.backend == "openai:http://gpu1:8000/v1"
    # No usage at all (a server that ignores include_usage): counts unknown, timings kept.
    bare = _metrics(None, {}, {"ttft_s": 0.4, "e2e_s": 2.4, "decode_s": 2.0})
    assert bare.num_cached_tokens is None and bare.e2e_s == 2.4
