"""Bad input to the REST API is a 400 naming what was wrong, never a 500: numbers past the
database's range or a sane bound, non-finite floats (a form's "nan"), ids past any id (bodies,
query strings, URLs), bodies nested too deep to parse."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from town.models import Run

from .factories import small_town_factory

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(django_user_model) -> APIClient:
    client = APIClient()
    user = django_user_model.objects.create_user("ops", is_staff=True)
    client.force_authenticate(user=user)
    return client


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("seed", 2**31, "less than or equal to 2147483647"),
        ("seed", 2**63, "less than or equal to 2147483647"),
        ("seed", -(2**31) - 1, "greater than or equal to -2147483648"),
        ("concurrency", 10**6, "less than or equal to 256"),
        ("ticks_target", 2**40, "less than or equal to 1000000"),
        ("retention_interval", 2**40, "less than or equal to 1048576"),
        ("minutes_per_tick", 10**9, "less than or equal to 1440"),
        ("decision_timeout_s", 1e12, "less than or equal to 86400"),
        ("town", 10**23, "must be an id between 1 and"),
        ("town", 2**63, "must be an id between 1 and"),
    ],
)
def test_numbers_out_of_range_are_400_naming_the_field(staff, field, value, words):
    body = {"town": small_town_factory().pk, field: value}
    response = staff.post("/api/runs/", body, format="json")
    assert response.status_code == 400, response.content
    assert words in " ".join(response.json()[field])
    assert not Run.objects.exists()


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity"])
@pytest.mark.parametrize("field", ["temperature", "decision_timeout_s"])
def test_non_finite_floats_from_a_form_are_400(staff, field, value):
    body = {"town": small_town_factory().pk, field: value}
    response = staff.post("/api/runs/", body)  # multipart: the value arrives as a string
    assert response.status_code == 400, response.content
    assert response.json()[field]
    assert not Run.objects.exists()


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_json_nan_and_infinity_literals_are_400(staff, literal):
    town = small_town_factory()
    body = f'{{"town": {town.pk}, "temperature": {literal}}}'
    response = staff.post("/api/runs/", body, content_type="application/json")
    assert response.status_code == 400 and "JSON parse error" in response.json()["detail"]


def test_a_tiny_positive_temperature_is_a_valid_run(staff):
    # The engine runs a temperature below 1e-5 as greedy; the run itself is fine.
    body = {"town": small_town_factory().pk, "temperature": 1e-300}
    assert staff.post("/api/runs/", body, format="json").status_code == 201


def test_a_body_nested_100000_deep_is_400(staff):
    body = "[" * 100_000 + "]" * 100_000
    response = staff.post("/api/runs/", body, content_type="application/json")
    assert response.status_code == 400 and "nested too deeply" in response.json()["detail"]
    response = staff.post("/api/decisions/", body, content_type="application/json")
    assert response.status_code == 400


@pytest.mark.parametrize(
    "url",
    ["/api/places/?town=10**23", f"/api/places/?town={10**23}", f"/api/runs/?town={2**63}"],
)
def test_query_string_ids_out_of_range_are_400(staff, url):
    response = staff.get(url)
    assert response.status_code == 400
    assert "town" in response.json()


@pytest.mark.parametrize(
    "url",
    [
        f"/api/runs/{10**23}/",
        f"/api/towns/{2**63}/",
        f"/runs/{10**23}/",
        f"/runs/{10**23}/replay.json",
    ],
)
def test_ids_too_long_in_urls_are_404(staff, url):
    staff.force_login(staff.handler._force_user)
    assert staff.get(url).status_code == 404


def test_decision_ids_out_of_range_are_400(staff):
    response = staff.post("/api/decisions/", {"run": 10**23, "resident": 1}, format="json")
    assert response.status_code == 400 and "must be an id" in " ".join(response.json()["run"])
