"""The REST API: every endpoint, its error answers (404 / 400 / 409, never 500), the OpenAPI
schema, and one decision asked for through the API and computed by a real Celery worker."""

from __future__ import annotations

import json
import time

import pytest
from rest_framework.test import APIClient

from town import services
from town.demo import demo_town_create
from town.models import Decision, Run, Tick
from town.simulation import tick_run
from town.tasks import decision_send

from .factories import small_town_factory

D = Decision.Status


@pytest.fixture
def api(django_user_model) -> APIClient:
    """A client logged in as staff (writes need it, as the run pages' controls; reads do not:
    tests/town/test_api_permissions.py)."""
    client = APIClient()
    user, _ = django_user_model.objects.get_or_create(username="api-user", is_staff=True)
    client.force_authenticate(user=user)
    return client


def test_reads_are_open_and_writes_need_a_user(db):
    town = small_town_factory()
    run = services.run_create(town=town, nodes=["local"])
    anonymous = APIClient()
    assert anonymous.get(f"/api/runs/{run.pk}/").status_code == 200
    for url, body in [
        ("/api/runs/", {"town": town.pk}),
        (f"/api/runs/{run.pk}/start/", {}),
        ("/api/decisions/", {"run": run.pk, "resident": town.residents.first().pk}),
    ]:
        response = anonymous.post(url, body, format="json")
        assert response.status_code in (401, 403), url
        assert "credentials were not provided" in response.json()["detail"]
    run.refresh_from_db()
    assert run.status == Run.Status.CREATED and not run.ticks.exists()


def _with_tick(town) -> tuple[Run, Tick]:
    """A run with its first tick begun (one pending Decision per resident), two of them answered
    with metrics as a worker would store them."""
    run = services.run_create(town=town, nodes=["local"])
    tick = services.tick_begin(run=run)
    for decision, (prompt, cached) in zip(
        tick.decisions.order_by("id"), [(100, 0), (100, 60)], strict=False
    ):
        Decision.objects.filter(pk=decision.pk).update(
            status=D.COMPUTED,
            num_prompt_tokens=prompt,
            num_cached_tokens=cached,
            num_output_tokens=20,
            prefill_s=0.5,
            queue_s=0.1,
            decode_s=1.0,
            app_e2e_s=2.0,
            engine_e2e_s=1.6,
        )
    return run, tick


def test_towns_places_and_residents_read(api, db):
    town = small_town_factory()
    response = api.get("/api/towns/")
    assert response.status_code == 200
    (row,) = [t for t in response.json()["results"] if t["id"] == town.pk]
    assert row["num_places"] == 5 and row["num_residents"] == 4
    assert row["url"].endswith(f"/api/towns/{town.pk}/")
    assert api.get(f"/api/towns/{town.pk}/").json()["name"] == town.name

    places = api.get(f"/api/places/?town={town.pk}").json()
    assert [p["name"] for p in places["results"]] == ["Home A", "Home B", "Cafe", "Bakery", "Park"]
    cafe = places["results"][2]
    assert cafe["capacity"] == 2 and cafe["menu"][0]["item"] == "latte"

    residents = api.get(f"/api/residents/?town={town.pk}").json()["results"]
    assert [r["name"] for r in residents] == ["Aki", "Ben", "Chie", "Dai"]
    assert all(r["state"] is None for r in residents)  # no run yet
    run = services.run_create(town=town, nodes=["local"])
    aki = api.get(f"/api/residents/{residents[0]['id']}/?run={run.pk}").json()
    assert aki["state"]["run"] == run.pk and aki["state"]["place_name"] == "Home A"
    assert aki["state"]["money"] == 1000
    latest = api.get(f"/api/residents/?town={town.pk}").json()["results"]
    assert all(r["state"]["run"] == run.pk for r in latest)


def test_runs_ticks_and_decisions_read_with_metrics_and_filters(api, db):
    town = small_town_factory()
    run, tick = _with_tick(town)
    detail = api.get(f"/api/runs/{run.pk}/").json()
    assert detail["status"] == "created" and detail["layout"] == "shared_head"
    summary = detail["summary"]
    assert summary["num_decisions"] == 2
    assert summary["token_cache_hit_rate"] == pytest.approx(60 / 200)
    assert summary["mean_cached_tokens"] == 30 and summary["median_e2e_s"] == 2.0
    assert api.get(f"/api/runs/?town={town.pk}").json()["count"] == 1

    ticks = api.get(f"/api/ticks/?run={run.pk}").json()["results"]
    assert [(t["index"], t["status"], t["num_decisions"]) for t in ticks] == [(0, "deciding", 4)]

    listed = api.get(f"/api/decisions/?run={run.pk}&page_size=3").json()
    assert listed["count"] == 4 and len(listed["results"]) == 3 and listed["next"]
    assert "messages" not in listed["results"][0]
    computed = api.get(f"/api/decisions/?run={run.pk}&status=computed").json()["results"]
    assert [d["num_cached_tokens"] for d in computed] == [0, 60]
    aki = computed[0]["resident"]
    assert api.get(f"/api/decisions/?resident={aki}").json()["count"] == 1
    assert api.get(f"/api/decisions/?tick={tick.pk}&node=local").json()["count"] == 4
    assert api.get("/api/decisions/?node=nowhere").json()["count"] == 0
    one = api.get(f"/api/decisions/{computed[1]['id']}/").json()
    assert one["messages"][0]["role"] == "system" and one["json_schema"]["title"] == "Decision"
    assert one["prefill_s"] == 0.5 and one["tick_index"] == 0


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("/api/decisions/?run=abc", "run"),
        ("/api/decisions/?resident=1.5", "resident"),
        ("/api/decisions/?status=done", "status"),
        ("/api/decisions/?valid=maybe", "valid"),
        ("/api/residents/?run=x", "run"),
        ("/api/places/?town=first", "town"),
    ],
)
def test_bad_query_parameters_are_400_naming_the_parameter(api, db, url, field):
    response = api.get(url)
    assert response.status_code == 400
    assert field in response.json() and response.json()[field][0]


@pytest.mark.parametrize(
    "url",
    [
        "/api/towns/999999/",
        "/api/places/999999/",
        "/api/residents/999999/",
        "/api/runs/999999/",
        "/api/ticks/999999/",
        "/api/decisions/999999/",
        "/api/runs/abc/",
    ],
)
def test_unknown_ids_are_404(api, db, url):
    response = api.get(url)
    assert response.status_code == 404


def test_runs_are_created_and_controlled_with_409_in_the_wrong_state(api, db):
    town = small_town_factory()
    response = api.post(
        "/api/runs/",
        {
            "town": town.pk,
            "layout": "naive",
            "ticks_target": 3,
            "nodes": ["local"],
            "routing": "round_robin",
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    run = response.json()
    assert run["status"] == "created" and run["layout"] == "naive" and run["ticks_target"] == 3
    assert run["routing"] == "round_robin"
    assert response["Location"] == run["url"]
    base = f"/api/runs/{run['id']}"
    assert api.post(f"{base}/start/").json()["status"] == "running"
    conflict = api.post(f"{base}/start/")
    assert conflict.status_code == 409
    assert "it is running" in conflict.json()["detail"]
    assert api.post(f"{base}/step/").status_code == 409  # pause a running run first
    assert api.post(f"{base}/pause/").json()["status"] == "paused"
    stepped = api.post(f"{base}/step/").json()
    assert stepped["status"] == "paused" and stepped["num_steps_pending"] == 1
    assert api.post(f"{base}/stop/").json()["status"] == "stopped"
    assert api.post(f"{base}/pause/").status_code == 409
    assert api.post(f"{base}/resume/").json()["status"] == "running"
    assert api.post("/api/runs/999999/start/").status_code == 404

    started = api.post("/api/runs/", {"town": town.pk, "start": True}, format="json").json()
    assert started["status"] == "running"


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({}, "town", "required"),
        ({"town": 999999}, "town", "does not exist"),
        ({"town": "TOWN", "layout": "naive"}, "town", "Incorrect type"),
        ({"layout": "fancy"}, "layout", "not a valid choice"),
        ({"routing": "random"}, "routing", "not a valid choice"),
        ({"concurrency": 0}, "concurrency", "greater than or equal to 1"),
        ({"temperature": 3}, "temperature", "less than or equal to 2"),
        ({"nodes": ["spark-z"]}, "detail", "unknown inference node 'spark-z'"),
        ({"model": "gpt-9"}, "detail", "not 'gpt-9'"),
    ],
)
def test_bad_run_bodies_are_400_with_field_messages(api, db, body, field, words):
    town = small_town_factory()
    body = {"town": town.pk, **body} if "town" not in body and body else body
    response = api.post("/api/runs/", body, format="json")
    assert response.status_code == 400
    message = response.json()[field]
    assert words in (message if isinstance(message, str) else " ".join(message))


def test_malformed_json_is_400(api, db):
    response = api.post("/api/runs/", "{not json", content_type="application/json")
    assert response.status_code == 400 and "JSON parse error" in response.json()["detail"]


def test_asking_for_a_decision_is_202_then_409_when_asked_again(api, db):
    town = small_town_factory()
    run = services.run_create(town=town, nodes=["local"])
    aki = town.residents.get(name="Aki")
    response = api.post("/api/decisions/", {"run": run.pk, "resident": aki.pk}, format="json")
    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["status"] == "queued" and response["Location"] == body["url"]
    decision = Decision.objects.get(pk=body["id"])
    assert decision.resident == aki and decision.tick.index == 0 and decision.node == "local"
    # The other residents' decisions of that tick wait for the tick loop.
    assert sorted(decision.tick.decisions.values_list("status", flat=True)) == [
        "pending",
        "pending",
        "pending",
        "queued",
    ]
    again = api.post("/api/decisions/", {"run": run.pk, "resident": aki.pk}, format="json")
    assert again.status_code == 409 and f"decision {decision.pk}" in again.json()["detail"]


def test_asking_for_a_decision_errors(api, db):
    town = small_town_factory()
    other = small_town_factory()
    run = services.run_create(town=town, nodes=["local"])
    stranger = other.residents.first()
    response = api.post("/api/decisions/", {"run": run.pk, "resident": stranger.pk}, format="json")
    assert response.status_code == 400 and "not in run" in response.json()["detail"]
    aki = town.residents.get(name="Aki")
    missing = api.post("/api/decisions/", {"run": 999999, "resident": aki.pk}, format="json")
    assert missing.status_code == 400 and "does not exist" in missing.json()["run"][0]
    assert api.post("/api/decisions/", {}, format="json").json()["resident"]
    services.run_start(run=run)
    busy = api.post("/api/decisions/", {"run": run.pk, "resident": aki.pk}, format="json")
    assert busy.status_code == 409 and "pause a running one first" in busy.json()["detail"]


def test_openapi_schema_validates_and_docs_use_vendored_assets(api, db):
    from drf_spectacular.validation import validate_schema

    response = api.get("/api/schema/?format=json")
    assert response.status_code == 200
    schema = json.loads(response.content)
    validate_schema(schema)  # raises on an invalid OpenAPI 3 document
    for path in ["/api/runs/{id}/start/", "/api/decisions/", "/api/residents/{id}/"]:
        assert path in schema["paths"]
    assert "202" in schema["paths"]["/api/decisions/"]["post"]["responses"]
    assert "409" in schema["paths"]["/api/runs/{id}/pause/"]["post"]["responses"]
    for page, assets in [
        ("/api/docs/", "/static/drf_spectacular_sidecar/"),
        ("/api/redoc/", "/static/vendor/redoc/"),
    ]:
        html = api.get(page).content.decode()
        assert assets in html and "cdn" not in html.lower()


def test_the_run_list_reads_every_summary_in_one_query(api, db, django_assert_max_num_queries):
    """The run list's summaries are one query per page, not one per run (an N+1 before)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    town = small_town_factory()
    first, _ = _with_tick(town)
    with CaptureQueriesContext(connection) as one_run:
        page = api.get("/api/runs/").json()
    assert page["results"][0]["summary"]["num_decisions"] == 2
    for _ in range(5):
        _with_tick(town)
    with django_assert_max_num_queries(len(one_run)):
        page = api.get("/api/runs/").json()
    assert page["count"] == 6
    summaries = [row["summary"] for row in page["results"]]
    assert [s["num_decisions"] for s in summaries] == [2] * 6
    assert summaries[-1]["token_cache_hit_rate"] == 0.3  # 60 of 200 prompt tokens
    assert api.get(f"/api/runs/{first.pk}/").json()["summary"] == summaries[-1]


def test_openapi_schema_lists_each_list_endpoints_filter_parameters(api, db):
    schema = json.loads(api.get("/api/schema/?format=json").content)

    def parameters(path: str) -> dict[str, dict]:
        return {p["name"]: p for p in schema["paths"][path]["get"]["parameters"]}

    decisions = parameters("/api/decisions/")
    assert {"run", "resident", "tick", "node", "status", "valid", "action"} <= set(decisions)
    for name in ("run", "resident", "tick"):
        assert decisions[name]["schema"]["type"] == "integer", name
        assert decisions[name]["in"] == "query" and decisions[name]["description"]
    assert decisions["valid"]["schema"]["type"] == "boolean"
    assert set(decisions["status"]["schema"]["enum"]) == set(Decision.Status.values)
    for path in ("/api/places/", "/api/residents/", "/api/runs/"):
        assert parameters(path)["town"]["schema"]["type"] == "integer", path
    assert parameters("/api/ticks/")["run"]["schema"]["type"] == "integer"
    assert "state in this run" in parameters("/api/residents/")["run"]["description"]
    assert "state in this run" in parameters("/api/residents/{id}/")["run"]["description"]


def test_filter_parameters_read_as_before(api, db):
    run, _ = _with_tick(small_town_factory())
    assert api.get(f"/api/decisions/?run={run.pk}&valid=").json()["count"] == 4  # blank: all
    assert api.get(f"/api/decisions/?run={run.pk}&valid=no").json()["count"] == 0
    assert api.get(f"/api/decisions/?run={run.pk}&status=&node=").json()["count"] == 4
    assert api.get(f"/api/runs/?town={run.town_id + 1}").json()["count"] == 0
    bad = api.get("/api/decisions/?status=done&run=abc").json()
    assert bad["status"] == ["must be one of " + ", ".join(D.values) + "; got 'done'"]
    assert bad["run"] == ["must be a whole number (an id), got 'abc'"]


def _wait_for(decision_id: int, statuses: tuple[str, ...], api: APIClient, timeout_s=120) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        body = api.get(f"/api/decisions/{decision_id}/").json()
        if body["status"] in statuses:
            return body
        assert time.monotonic() < deadline, f"decision still {body['status']}"
        time.sleep(0.1)


def test_a_decision_asked_through_the_api_runs_on_a_worker_and_the_tick_keeps_it(
    api, celery_worker_process
):
    worker = celery_worker_process()
    town = demo_town_create(seed=0)
    run = services.run_create(town=town, nodes=[worker.queue], ticks_target=1)
    resident = town.residents.order_by("id")[3]
    response = api.post("/api/decisions/", {"run": run.pk, "resident": resident.pk}, format="json")
    assert response.status_code == 202
    url = response.json()["url"]
    first = api.get(url).json()
    assert first["status"] in ("queued", "running", "computed")
    done = _wait_for(response.json()["id"], ("computed", "failed"), api)
    assert done["status"] == "computed", done["error"]
    assert done["worker"] == worker.hostname and done["node"] == worker.queue
    assert done["num_prompt_tokens"] > 500 and done["num_output_tokens"] > 0
    assert done["prefill_s"] > 0 and done["engine_e2e_s"] > 0 and done["app_e2e_s"] > 0
    chosen = json.loads(done["raw_output"])  # schema-constrained, even from the tiny model
    assert (done["action"], done["target"]) == (chosen["action"], chosen["target"])  # not applied

    # Stepping the run finishes that tick: the asked decision is applied as it was computed.
    assert api.post(f"/api/runs/{run.pk}/start/").status_code == 200
    tick = tick_run(run_id=run.pk, send=decision_send, owner="test", poll_s=0.05)
    assert tick.status == Tick.Status.DONE and tick.index == 0
    applied = api.get(url).json()
    assert applied["status"] == "applied" and applied["raw_output"] == done["raw_output"]
    assert applied["computed_at"] == done["computed_at"]
    assert Decision.objects.filter(run=run, status=D.APPLIED).count() == 10


def test_a_decision_shows_its_choice_once_computed_before_it_is_applied(api, db):
    town = small_town_factory()
    run = services.run_create(town=town, nodes=["local"])
    aki = town.residents.get(name="Aki")
    url = api.post("/api/decisions/", {"run": run.pk, "resident": aki.pk}, format="json")[
        "Location"
    ]
    queued = api.get(url).json()
    assert (queued["status"], queued["action"], queued["target"], queued["reason"]) == (
        "queued",
        "",
        "",
        "",
    )
    # What the node's worker does with the message (on this process's engine, the tiny model).
    decision_id = queued["id"]
    assert services.decision_compute(decision_id=decision_id, worker="test")
    computed = api.get(url).json()
    chosen = json.loads(computed["raw_output"])
    assert computed["status"] == "computed" and computed["valid"] is None
    assert computed["action"] == chosen["action"] != ""
    assert (computed["target"], computed["reason"]) == (chosen["target"], chosen["reason"])
    listed = api.get(f"/api/decisions/?run={run.pk}&status=computed").json()["results"]
    assert [(d["id"], d["action"]) for d in listed] == [(decision_id, chosen["action"])]
    # The stored fields still say nothing until the tick applies it.
    assert Decision.objects.get(pk=decision_id).action == ""

    # An answer outside the schema shows no choice (the tick records why when it applies it).
    Decision.objects.filter(pk=decision_id).update(raw_output='{"action": "fly"}')
    broken = api.get(url).json()
    assert (broken["status"], broken["action"], broken["target"]) == ("computed", "", "")
    # Applied: what the tick stored.
    Decision.objects.filter(pk=decision_id).update(
        status=D.APPLIED, action="stay", target="Home A", reason="tired", valid=True
    )
    applied = api.get(url).json()
    assert (applied["action"], applied["target"], applied["reason"]) == ("stay", "Home A", "tired")
