"""The town view's pages and JSON: run list, run page, resident panel, replay (each resident's
state as of each tick), and the staff controls (the run services, and their events)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from tests.town.factories import run_factory, small_town_factory
from town import services
from town.models import Decision, RunEvent

pytestmark = pytest.mark.django_db


def _answer_all(tick, value: dict) -> None:
    """Answer every decision of the tick as a worker would, with the same JSON."""
    for decision in tick.decisions.all():
        Decision.objects.filter(pk=decision.pk).update(
            status=Decision.Status.COMPUTED,
            raw_output=json.dumps(value),
            finish_reason="stop",
            num_prompt_tokens=1000,
            num_cached_tokens=600,
            num_output_tokens=20,
            app_e2e_s=0.5,
        )


def _two_ticks(run):
    """Tick 0: everyone goes to the park; tick 1: everyone stays there."""
    for value in (
        {"action": "go", "target": "Park", "reason": "I want fresh air."},
        {"action": "stay", "target": "Park", "reason": "I still like it."},
    ):
        tick = services.tick_begin(run=run)
        _answer_all(tick, value)
        services.tick_finish(tick=tick)
        run.refresh_from_db()


@pytest.fixture
def run():
    return run_factory(town=small_town_factory())


@pytest.fixture
def staff_client(client):
    user = get_user_model().objects.create_user("boss", password="pw-for-tests", is_staff=True)
    client.force_login(user)
    return client


def test_run_list_links_every_run(client, run):
    other = run_factory(town=run.town)
    response = client.get(reverse("town:run-list"))
    assert response.status_code == 200
    html = response.content.decode()
    for r in (run, other):
        assert f'href="/runs/{r.pk}/"' in html and f'href="/runs/{r.pk}/replay/"' in html


def test_run_list_says_how_to_start_when_there_are_no_runs(client):
    html = client.get("/").content.decode()
    assert "No runs yet" in html and "create_run --start" in html


def test_home_page_says_what_the_town_is_and_links_the_whole_site(client, run):
    html = client.get("/").content.decode()
    assert "small Japanese town" in html and "asking an LLM" in html
    assert "our own inference engine with prefix caching" in html
    for href in (
        f"/runs/{run.pk}/",  # the newest run, live
        f"/runs/{run.pk}/replay/",
        "/admin/",
        "/api/redoc/",
        "/api/docs/",
        "/api/schema/",
        "/v1/models",
        "/metrics",
    ):
        assert f'href="{href}"' in html, href


def test_an_empty_feed_says_it_waits_for_the_first_tick(client, run):
    for path in (f"/runs/{run.pk}/", f"/runs/{run.pk}/replay/"):
        html = client.get(path).content.decode()
        assert '<p id="feed-empty" class="hint">Waiting for the first tick…</p>' in html


def test_run_page_has_the_map_and_scripts_and_controls_only_for_staff(client, run):
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert '<canvas id="town-map"' in html and "town/live.js" in html
    assert f"runId: {run.pk}" in html
    assert 'data-control="start"' not in html
    staff = get_user_model().objects.create_user("s", password="pw-for-tests", is_staff=True)
    client.force_login(staff)
    html = client.get(f"/runs/{run.pk}/").content.decode()
    for control in ("start", "pause", "step", "stop"):
        assert f'data-control="{control}"' in html


def test_static_files_are_found(client):
    from django.contrib.staticfiles import finders

    names = ["map.js", "layout.js", "overlay.js", "panel.js", "live.js", "replay.js", "town.css"]
    for name in names:
        assert finders.find(f"town/{name}"), name


def test_unknown_run_is_404(client):
    assert client.get("/runs/999999/").status_code == 404
    assert client.get("/runs/999999/replay.json").status_code == 404


def test_login_required_sends_anonymous_users_to_log_in(client, run, settings):
    settings.TOWN_VIEW_LOGIN_REQUIRED = True
    response = client.get(f"/runs/{run.pk}/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    user = get_user_model().objects.create_user("u", password="pw-for-tests")
    client.force_login(user)
    assert client.get(f"/runs/{run.pk}/").status_code == 200


def test_resident_panel_has_state_memories_and_last_decisions(client, run):
    _two_ticks(run)
    aki = run.resident_states.get(resident__name="Aki")
    response = client.get(f"/runs/{run.pk}/residents/{aki.resident_id}/")
    assert response.status_code == 200
    detail = response.json()
    assert detail["name"] == "Aki" and detail["state"]["place_name"] == "Park"
    state = detail["state"]  # the resident as the REST API gives it, in this run
    assert (state["hunger"], state["energy"], state["money"]) == (
        aki.hunger,
        aki.energy,
        aki.money,
    )
    assert detail["likes"] == ["cafe"]
    assert detail["memories"]
    assert [(d["tick_index"], d["action"]) for d in detail["decisions"]] == [(1, "stay"), (0, "go")]
    assert detail["decisions"][0]["num_cached_tokens"] == 600
    assert detail["decisions"][0]["app_e2e_s"] == 0.5
    other_run = run_factory(town=small_town_factory())
    stranger = other_run.resident_states.first().resident_id
    assert client.get(f"/runs/{run.pk}/residents/{stranger}/").status_code == 404


def test_replay_gives_each_residents_state_as_of_each_tick(client, run):
    homes = dict(run.resident_states.values_list("resident_id", "place_id"))
    start_hunger = dict(run.resident_states.values_list("resident_id", "hunger"))
    _two_ticks(run)
    park = run.town.places.get(name="Park").pk
    data = client.get(f"/runs/{run.pk}/replay.json").json()
    frames = data["frames"]
    assert [f["tick_index"] for f in frames] == [0, 1, 2]
    assert [f["clock"]["hhmm"] for f in frames] == ["07:00", "09:00", "11:00"]
    # As each tick began, not as the run ended.
    assert {int(k): s["place_id"] for k, s in frames[0]["states"].items()} == homes
    assert {int(k): s["hunger"] for k, s in frames[0]["states"].items()} == start_hunger
    assert {s["place_id"] for s in frames[1]["states"].values()} == {park}
    hunger = [
        frames[i]["states"][str(run.resident_states.first().resident_id)]["hunger"]
        for i in range(3)
    ]
    assert hunger[0] < hunger[1] < hunger[2]
    end = dict(run.resident_states.values_list("resident_id", "hunger"))
    assert {int(k): s["hunger"] for k, s in frames[2]["states"].items()} == end
    assert [d["action"] for d in frames[0]["decisions"]] == ["go"] * 4
    assert [d["action"] for d in frames[1]["decisions"]] == ["stay"] * 4
    assert frames[2]["decisions"] == []
    # Memories carry the tick that made them, so a frame shows only the earlier ones.
    memories = [m for ms in data["memories"].values() for m in ms]
    assert 0 in {m["tick_index"] for m in memories}  # the walk to the park
    assert all(m["text"] for m in memories)
    assert {m["tick_index"] for m in memories} <= {None, 0, 1}
    assert {p["name"] for p in data["places"]} >= {"Park", "Cafe"}
    assert park in frames[0]["open_place_ids"]
    cafe = run.town.places.get(name="Cafe").pk  # opens at 8
    assert cafe not in frames[0]["open_place_ids"] and cafe in frames[1]["open_place_ids"]
    assert "town/replay.js" in client.get(f"/runs/{run.pk}/replay/").content.decode()


def test_replay_of_a_run_with_no_ticks_is_its_starting_state(client, run):
    frames = client.get(f"/runs/{run.pk}/replay.json").json()["frames"]
    assert len(frames) == 1 and frames[0]["decisions"] == []
    assert len(frames[0]["states"]) == 4


def test_controls_are_staff_only(client, run):
    response = client.post(f"/runs/{run.pk}/control/start/")
    assert response.status_code == 403 and "staff" in response.json()["error"]
    user = get_user_model().objects.create_user("u", password="pw-for-tests")
    client.force_login(user)
    assert client.post(f"/runs/{run.pk}/control/start/").status_code == 403
    run.refresh_from_db()
    assert run.status == "created"


def test_controls_call_the_run_services_and_emit_events(staff_client, run):
    for control, status in [("start", "running"), ("pause", "paused"), ("step", "paused")]:
        response = staff_client.post(f"/runs/{run.pk}/control/{control}/")
        assert response.status_code == 200, response.content
        assert response.json()["run"]["status"] == status
    run.refresh_from_db()
    assert (run.status, run.num_steps_pending) == ("paused", 1)
    assert (
        list(RunEvent.objects.filter(run=run).values_list("kind", flat=True)) == ["run.state"] * 3
    )
    response = staff_client.post(f"/runs/{run.pk}/control/start/")
    assert response.status_code == 409 and "cannot start" in response.json()["error"]
    response = staff_client.post(f"/runs/{run.pk}/control/explode/")
    assert response.status_code == 400 and "start, pause" in response.json()["error"]
    assert staff_client.get(f"/runs/{run.pk}/control/stop/").status_code == 405


def test_controls_need_the_csrf_token(run):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    user = get_user_model().objects.create_user("b", password="pw-for-tests", is_staff=True)
    client.force_login(user)
    assert client.post(f"/runs/{run.pk}/control/start/").status_code == 403
    page = client.get(f"/runs/{run.pk}/")
    token = page.cookies["csrftoken"].value
    response = client.post(f"/runs/{run.pk}/control/start/", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200


def test_the_live_views_entities_have_the_rest_apis_shape(client, run):
    """One shape per entity: the snapshot's run, places and residents, the panel's resident, the
    replay's and the panel's decisions are what the REST API gives for them (URLs relative,
    with no request)."""
    from town.live import run_snapshot

    _two_ticks(run)

    def same(live: dict, rest: dict) -> bool:
        # The REST API's URLs are absolute (it has the request), the live view's relative.
        return json.loads(json.dumps(live).replace('"/api/', '"http://testserver/api/')) == rest

    snapshot = run_snapshot(run_id=run.pk)
    rest_run = client.get(f"/api/runs/{run.pk}/").json()
    assert same(snapshot["run"], rest_run) and snapshot["summary"] == rest_run["summary"]
    rest_places = client.get(f"/api/places/?town={run.town_id}").json()["results"]
    assert [{k: v for k, v in p.items() if k != "is_open"} for p in snapshot["places"]] == (
        rest_places
    )
    rest_decisions = {
        d["id"]: d for d in client.get(f"/api/decisions/?run={run.pk}").json()["results"]
    }
    replay = client.get(f"/runs/{run.pk}/replay.json").json()
    shown = [d for frame in replay["frames"] for d in frame["decisions"]]
    aki = run.resident_states.get(resident__name="Aki").resident_id
    shown += client.get(f"/runs/{run.pk}/residents/{aki}/").json()["decisions"]
    latest = [r["latest_decision"] for r in snapshot["residents"]]
    assert {d["tick_index"] for d in latest} == {1}  # each resident's newest: tick 1's
    assert [d["resident"] for d in latest] == [r["id"] for r in snapshot["residents"]]
    shown += latest
    assert len(shown) == 8 + 2 + 4
    assert all(same(d, rest_decisions[d["id"]]) for d in shown)
    rest_residents = client.get(f"/api/residents/?town={run.town_id}&run={run.pk}").json()
    live_residents = [
        {k: v for k, v in r.items() if k not in ("thinking", "latest_decision")}
        for r in snapshot["residents"]
    ]
    assert live_residents == rest_residents["results"]
    panel = client.get(f"/runs/{run.pk}/residents/{aki}/").json()
    rest_aki = client.get(f"/api/residents/{aki}/?run={run.pk}").json()
    assert {k: v for k, v in panel.items() if k not in ("memories", "decisions")} == rest_aki
