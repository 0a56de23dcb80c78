"""The API for machine clients: a DRF token (`manage.py drf_create_token <user>`) in the
Authorization header, as curl sends it — no session, no CSRF token. The client here checks CSRF
as a real server does (the test client's default skips it, which hid a token's POST being
refused for want of one)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.test import Client
from rest_framework.authtoken.models import Token

from town import services
from town.models import Decision, Run

from .factories import small_town_factory

pytestmark = pytest.mark.django_db


@pytest.fixture
def run() -> Run:
    return services.run_create(town=small_town_factory(), nodes=["local"])


@pytest.fixture
def client() -> Client:
    return Client(enforce_csrf_checks=True)


def _ask(client: Client, run: Run, authorization: str | None, resident_index: int = 0):
    resident = run.town.residents.order_by("id")[resident_index]
    headers = {"Authorization": authorization} if authorization is not None else {}
    return client.post(
        "/api/decisions/",
        {"run": run.pk, "resident": resident.pk},
        content_type="application/json",
        headers=headers,
    )


def _token(django_user_model, username: str, **fields) -> str:
    user = django_user_model.objects.create_user(username, **fields)
    out = io.StringIO()
    call_command("drf_create_token", username, stdout=out)
    key = out.getvalue().split()[2]  # "Generated token <key> for user <username>"
    assert Token.objects.get(user=user).key == key
    return key


def test_a_staff_token_asks_for_a_decision_and_reads_it(client, django_user_model, run, redis_url):
    key = _token(django_user_model, "ops", is_staff=True)
    for index, scheme in enumerate(["Token", "Bearer"]):
        response = _ask(client, run, f"{scheme} {key}", resident_index=index)
        assert response.status_code == 202, response.content
        body = response.json()
        assert body["status"] == "queued" and response["Location"] == body["url"]
        polled = client.get(body["url"], headers={"Authorization": f"Token {key}"})
        assert polled.status_code == 200 and polled.json()["id"] == body["id"]
    assert Decision.objects.filter(run=run, status="queued").count() == 2


def test_without_a_token_it_is_refused(client, run):
    response = _ask(client, run, None)
    assert response.status_code in (401, 403)
    assert response.json()["detail"] == "Authentication credentials were not provided."
    assert not Decision.objects.exists()


@pytest.mark.parametrize(
    ("authorization", "message"),
    [
        ("Token 0123456789abcdef0123456789abcdef01234567", "Invalid token."),
        ("Bearer nope", "Invalid token."),
        ("Token", "Invalid token header"),
        ("Token two keys", "Invalid token header"),
    ],
)
def test_a_bad_token_is_refused(client, django_user_model, run, authorization, message):
    _token(django_user_model, "ops", is_staff=True)
    response = _ask(client, run, authorization)
    assert response.status_code in (401, 403)
    assert response.json()["detail"].startswith(message)
    assert not Decision.objects.exists()


def test_a_token_of_a_deactivated_or_ordinary_user_is_refused(client, django_user_model, run):
    rin = _token(django_user_model, "rin")
    response = _ask(client, run, f"Token {rin}")
    assert response.status_code == 403 and "is for staff" in response.json()["detail"]
    ops = _token(django_user_model, "ops", is_staff=True)
    django_user_model.objects.filter(username="ops").update(is_active=False)
    response = _ask(client, run, f"Token {ops}")
    assert response.status_code in (401, 403)
    assert response.json()["detail"] == "User inactive or deleted."
    assert not Decision.objects.exists()


def test_a_browser_session_still_needs_its_csrf_token(client, django_user_model, run):
    client.force_login(django_user_model.objects.create_user("ops", is_staff=True))
    response = _ask(client, run, None)
    assert response.status_code == 403 and "CSRF" in response.json()["detail"]
    assert not Decision.objects.exists()
