"""Run events: stored with gapless per-run seqs in the services' transactions, broadcast to the
run's group on the real Redis channel layer once they commit, and read back for a client that
missed some."""

from __future__ import annotations

import importlib
import threading

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection, transaction
from rest_framework.test import APIClient

from tests.town.factories import run_factory, small_town_factory
from tests.town.live_fixtures import isolated_channel_layer  # noqa: F401
from town import events, services
from town.models import Decision, RunEvent
from town.simulation import InlineSend, tick_run

pytestmark = pytest.mark.django_db(transaction=True)


def _kinds(run) -> list[tuple[int, str]]:
    return list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "kind"))


def test_run_controls_emit_run_state_events_in_order():
    run = run_factory(town=small_town_factory())
    services.run_start(run=run)
    services.run_pause(run=run)
    services.run_step(run=run)
    services.run_stop(run=run)
    stored = list(RunEvent.objects.filter(run=run).order_by("seq"))
    assert [(e.seq, e.kind) for e in stored] == [(i, events.RUN_STATE) for i in range(1, 5)]
    assert [e.data["status"] for e in stored] == ["running", "paused", "paused", "stopped"]
    assert stored[2].data["num_steps_pending"] == 1


@pytest.mark.usefixtures("isolated_channel_layer")
def test_an_event_of_a_rolled_back_transaction_is_neither_stored_nor_sent():
    run = run_factory(town=small_town_factory())
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(events.run_group(run.pk), channel)
    with pytest.raises(RuntimeError), transaction.atomic():
        events.event_emit(run_id=run.pk, kind="test.rolled_back", data={})
        raise RuntimeError("the service failed after emitting")
    assert not RunEvent.objects.filter(run=run).exists()
    events.run_state_emit(run=run)
    message = async_to_sync(layer.receive)(channel)
    # The seq the rolled-back event had is reused: no gap.
    assert message["type"] == events.GROUP_MESSAGE_TYPE
    assert (message["event"]["seq"], message["event"]["kind"]) == (1, "run.state")


@pytest.mark.usefixtures("isolated_channel_layer")
def test_events_are_broadcast_to_the_run_group_after_commit():
    run = run_factory(town=small_town_factory())
    other = run_factory(town=run.town)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(events.run_group(run.pk), channel)
    services.run_start(run=other)  # another run's group: not ours
    services.run_start(run=run)
    message = async_to_sync(layer.receive)(channel)
    event = message["event"]
    assert (event["seq"], event["kind"], event["data"]["status"]) == (1, "run.state", "running")
    assert event == events.events_after(run_id=run.pk, after_seq=0)[0]


def test_events_after_gives_exactly_the_missed_ones():
    run = run_factory(town=small_town_factory())
    for _ in range(5):
        events.event_emit(run_id=run.pk, kind="test.ping", data={})
    assert [e["seq"] for e in events.events_after(run_id=run.pk, after_seq=2)] == [3, 4, 5]
    window = events.events_after(run_id=run.pk, after_seq=1, up_to_seq=3)
    assert [e["seq"] for e in window] == [2, 3]
    assert events.events_after(run_id=run.pk, after_seq=5) == []
    assert events.last_seq(run_id=run.pk) == 5


def test_concurrent_emitters_get_distinct_gapless_seqs():
    run = run_factory(town=small_town_factory())
    errors = []

    def emit_some(name: str) -> None:
        try:
            for i in range(10):
                events.event_emit(run_id=run.pk, kind="test.ping", data={"by": name, "i": i})
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=emit_some, args=(f"t{n}",)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    seqs = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, 31))
    # Each emitter's own events keep their order.
    for name in ("t0", "t1", "t2"):
        mine = RunEvent.objects.filter(run=run, data__by=name).order_by("seq")
        assert [e.data["i"] for e in mine] == list(range(10))


def test_a_tick_emits_started_answered_applied_moved_and_advanced_in_order():
    run = services.run_start(run=run_factory(town=small_town_factory(), ticks_target=1))
    send = InlineSend(max_workers=4)
    try:
        tick = tick_run(run_id=run.pk, send=send, owner="test", poll_s=0.05)
    finally:
        send.shutdown()
    stored = list(RunEvent.objects.filter(run=run).order_by("seq"))
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
    kinds = [e.kind for e in stored]
    assert kinds[0] == "run.state"  # started
    assert kinds[1:5] == ["decision.started"] * 4
    # Each decision as soon as it is answered, while the tick waits for the others.
    assert kinds[5:9] == ["decision.answered"] * 4
    assert kinds[9:13] == ["decision.applied"] * 4
    moved = [e for e in stored if e.kind == "resident.moved"]
    assert kinds[13 : 13 + len(moved)] == ["resident.moved"] * len(moved)
    assert kinds[13 + len(moved) :] == ["tick.advanced", "run.state"]  # ticks_target reached
    assert stored[-1].data["status"] == "finished"

    decisions = {d.pk: d for d in Decision.objects.filter(tick=tick).select_related("resident")}
    started = [e.data for e in stored[1:5]]
    # A decision event carries the decision as GET /api/decisions/ lists it.
    assert sorted(e["id"] for e in started) == sorted(decisions)
    for data in started:
        d = decisions[data["id"]]
        assert (data["resident"], data["tick_index"], data["node"]) == (
            d.resident_id,
            tick.index,
            d.node,
        )
    for answered, event in zip(stored[5:9], stored[9:13], strict=True):
        d = decisions[event.data["id"]]
        assert event.data["resident_name"] == d.resident.name
        assert (event.data["action"], event.data["target"]) == (d.action, d.target)
        # Answered: what the resident decided, read from its output before the tick applied it.
        early = decisions[answered.data["id"]]
        assert answered.data["status"] == "computed" and answered.data["valid"] is None
        assert (answered.data["action"], answered.data["reason"]) == (early.action, early.reason)

    # One shape per entity: the REST API's decision and summary are the events'.
    api = APIClient()
    listed = {row["id"]: row for row in api.get(f"/api/decisions/?run={run.pk}").json()["results"]}
    for event in stored[9:13]:
        row = listed[event.data["id"]]
        assert row["url"].endswith(event.data["url"])
        assert {**event.data, "url": row["url"]} == row
    advanced = next(e for e in stored if e.kind == "tick.advanced")
    assert advanced.data["summary"] == api.get(f"/api/runs/{run.pk}/").json()["summary"]


def test_stored_decision_events_of_earlier_runs_take_the_new_shape():
    """Migration 0007 renames the keys of decision events stored before (and back)."""
    from django.apps import apps

    migration = importlib.import_module("town.migrations.0007_run_event_decision_shape")
    run = run_factory(town=small_town_factory())
    old = {"decision_id": 7, "resident_id": 3, "latency_s": 1.5, "action": "go"}
    event = RunEvent.objects.create(run=run, seq=1, kind="decision.applied", data=old)
    moved = RunEvent.objects.create(run=run, seq=2, kind="resident.moved", data={"resident_id": 3})
    migration.forwards(apps, None)
    event.refresh_from_db()
    moved.refresh_from_db()
    assert event.data == {"id": 7, "resident": 3, "app_e2e_s": 1.5, "action": "go"}
    assert moved.data == {"resident_id": 3}
    migration.backwards(apps, None)
    event.refresh_from_db()
    assert event.data == old
