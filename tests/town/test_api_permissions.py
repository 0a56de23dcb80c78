"""One policy for the API and the pages (town/access.py): anyone who may watch reads; creating
and controlling runs and asking for decisions is for staff, and for a Cloudflare Access service
token only when POKOMACHI_CONTROL_SERVICE_TOKENS lists its client id."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from pokosite.cloudflare_access.users import SERVICE_USERNAME_PREFIX
from town import services
from town.models import Run

from .factories import small_town_factory

pytestmark = pytest.mark.django_db

UNSAFE = ["create", "start", "pause", "resume", "step", "stop", "decision"]


def _request(client: APIClient, endpoint: str, run: Run):
    if endpoint == "create":
        return client.post("/api/runs/", {"town": run.town_id}, format="json")
    if endpoint == "decision":
        resident = run.town.residents.first()
        return client.post(
            "/api/decisions/", {"run": run.pk, "resident": resident.pk}, format="json"
        )
    return client.post(f"/api/runs/{run.pk}/{endpoint}/", {}, format="json")


def _client(django_user_model, username: str, **fields) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=django_user_model.objects.create_user(username, **fields))
    return client


@pytest.fixture
def run() -> Run:
    return services.run_create(town=small_town_factory(), nodes=["local"])


@pytest.mark.parametrize("endpoint", UNSAFE)
def test_a_person_who_is_not_staff_may_not(django_user_model, run, endpoint):
    response = _request(_client(django_user_model, "rin"), endpoint, run)
    assert response.status_code == 403, response.content
    assert "is for staff" in response.json()["detail"]
    assert Run.objects.count() == 1 and not run.ticks.exists()


@pytest.mark.parametrize("endpoint", UNSAFE)
def test_staff_may(django_user_model, run, endpoint):
    response = _request(_client(django_user_model, "ops", is_staff=True), endpoint, run)
    # Allowed: done, or refused for the run's state (409), never for who asks.
    assert response.status_code in (200, 201, 202, 409), response.content


@pytest.mark.parametrize("endpoint", UNSAFE)
def test_a_service_token_only_when_listed(django_user_model, settings, run, endpoint):
    token = _client(django_user_model, f"{SERVICE_USERNAME_PREFIX}abc123.access")
    settings.CONTROL_SERVICE_TOKENS = ["other.access"]
    assert _request(token, endpoint, run).status_code == 403
    settings.CONTROL_SERVICE_TOKENS = ["abc123.access"]
    assert _request(token, endpoint, run).status_code in (200, 201, 202, 409)


@pytest.mark.parametrize("endpoint", UNSAFE)
def test_anonymous_may_not(run, endpoint):
    assert _request(APIClient(), endpoint, run).status_code in (401, 403)


def test_reads_stay_open_as_watching(django_user_model, run, settings):
    assert APIClient().get(f"/api/runs/{run.pk}/").status_code == 200
    settings.TOWN_VIEW_LOGIN_REQUIRED = True
    assert APIClient().get(f"/api/runs/{run.pk}/").status_code in (401, 403)
    reader = _client(django_user_model, "rin")
    assert reader.get(f"/api/runs/{run.pk}/").status_code == 200


@pytest.mark.parametrize("is_staff", [False, True])
def test_the_page_and_the_api_agree(django_user_model, run, is_staff):
    user = django_user_model.objects.create_user("kenji", is_staff=is_staff)
    page = Client()
    page.force_login(user)
    api = APIClient()
    api.force_authenticate(user=user)
    from_page = page.post(f"/runs/{run.pk}/control/start/")
    run.refresh_from_db()
    page_allowed = run.status == Run.Status.RUNNING
    fresh = services.run_create(town=run.town, nodes=["local"])  # the same action, anew
    from_api = api.post(f"/api/runs/{fresh.pk}/start/")
    assert page_allowed == is_staff == (from_api.status_code == 200), (
        from_page.status_code,
        from_api.status_code,
    )
