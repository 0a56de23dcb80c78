"""Sending a decision again: a message lost between the broker and a dying worker is replaced,
and of several deliveries only one computes at a time (town/services/decisions.py). The same on
real Celery workers and the real Redis broker is in test_tasks.py."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import connection

from inference.fleet.health import NodeHeartbeat, heartbeat_store
from tests.town.factories import run_factory, small_town_factory
from town import events, services
from town.models import Decision, RunEvent
from town.services.decisions import _decision_answer, _decision_begin
from town.simulation import InlineSend, tick_run

pytestmark = pytest.mark.django_db(transaction=True)

D = Decision.Status


@pytest.fixture
def inline_send():
    send = InlineSend(max_workers=4)
    yield send
    send.shutdown()


def test_a_lost_first_send_is_sent_again_and_computed_once(settings, inline_send):
    settings.TOWN_DECISION_RESEND_S = 0.5
    run = services.run_start(run=run_factory(town=small_town_factory(), ticks_target=1))
    sends: list[tuple[int, int]] = []

    def lose_first_sends(decision_id: int, node: str, send: int) -> None:
        sends.append((decision_id, send))
        if send > 1:  # the first message of each decision is lost on its way
            inline_send(decision_id, node, send)

    tick = tick_run(run_id=run.pk, send=lose_first_sends, owner="test", poll_s=0.05)
    decisions = list(tick.decisions.all())
    assert {d.status for d in decisions} == {D.APPLIED}, [d.error for d in decisions]
    for d in decisions:
        # A slow machine may send a third copy before the second begins; one computes.
        assert d.num_sends >= 2 and d.started_send >= 2 and d.attempts == 1
        assert [s for i, s in sends if i == d.pk] == list(range(1, d.num_sends + 1))
    # One "thinking" event per decision, however often it was sent.
    started = RunEvent.objects.filter(run=run, kind=events.DECISION_STARTED)
    assert sorted(e.data["id"] for e in started) == sorted(d.pk for d in decisions)


def test_a_decision_begun_by_a_worker_is_not_sent_again(settings):
    settings.TOWN_DECISION_RESEND_S = 0.0
    run = services.run_start(run=run_factory(town=small_town_factory()))
    tick = services.tick_begin(run=run)
    decision = tick.decisions.order_by("resident_id").first()
    services.decision_dispatch(decision=decision, send=lambda *args: None)
    assert _decision_begin(decision_id=decision.pk, worker="w1", send=1) is not None
    decision.refresh_from_db()
    assert not services.decision_resend_due(decision=decision, resend_s=0.0)
    queued = Decision.objects.get(pk=decision.pk)
    queued.status = D.QUEUED  # a stale copy of the row, read before the worker began
    assert not services.decision_resend(decision=queued, send=lambda *args: None)
    assert Decision.objects.get(pk=decision.pk).num_sends == 1


def test_only_the_running_send_may_begin_a_running_decision_again():
    run = services.run_start(run=run_factory(town=small_town_factory()))
    tick = services.tick_begin(run=run)
    decision = tick.decisions.order_by("resident_id").first()
    services.decision_dispatch(decision=decision, send=lambda *args: None)
    services.decision_resend(decision=decision, send=lambda *args: None)
    # Send 2 arrives first and runs; send 1's copy (it was only waiting) is dropped.
    assert _decision_begin(decision_id=decision.pk, worker="w1", send=2) is not None
    assert _decision_begin(decision_id=decision.pk, worker="w2", send=1) is None
    # w1 dies: the broker hands send 2's message back, and that one may begin it again.
    again = _decision_begin(decision_id=decision.pk, worker="w3", send=2)
    assert again is not None and (again.attempts, again.retries, again.worker) == (2, 1, "w3")


def test_a_copy_of_a_decision_this_process_is_computing_is_dropped():
    """The broker hands a message out again while its live worker still computes it (past the
    visibility timeout, or prefetched twice): the copy must not begin a second attempt."""
    run = services.run_start(run=run_factory(town=small_town_factory()))
    tick = services.tick_begin(run=run)
    decision = tick.decisions.order_by("resident_id").first()
    services.decision_dispatch(decision=decision, send=lambda *args: None)
    barrier = threading.Barrier(2)
    stored: list[bool] = []

    def deliver() -> None:
        barrier.wait()
        try:
            stored.append(services.decision_compute(decision_id=decision.pk, worker="w1", send=1))
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(stored) == [False, True]
    decision.refresh_from_db()
    assert (decision.status, decision.attempts, decision.retries) == (D.COMPUTED, 1, 0)


def test_a_rerouted_decision_is_answered_only_from_its_new_send():
    """Node x fell silent while computing (send 1); the tick loop sent it to node y (send 2). x's
    answer, should it come after all, is dropped; y's is stored, once."""
    run = services.run_start(run=run_factory(town=small_town_factory()))
    tick = services.tick_begin(run=run)
    decision = tick.decisions.order_by("resident_id").first()
    services.decision_dispatch(decision=decision, send=lambda *args: None)
    assert _decision_begin(decision_id=decision.pk, worker="x@1", send=1) is not None
    decision.refresh_from_db()
    stale = Decision.objects.get(pk=decision.pk)
    assert services.decision_reroute(decision=decision, node="y", send=lambda *args: None)
    # A second pass that read the row before the first rerouted it sends nothing more.
    assert not services.decision_reroute(decision=stale, node="y", send=lambda *args: None)
    rerouted = Decision.objects.get(pk=decision.pk)
    assert (rerouted.node, rerouted.status, rerouted.num_sends) == ("y", D.QUEUED, 2)
    begun = _decision_begin(decision_id=decision.pk, worker="y@1", send=2)
    assert begun is not None and begun.attempts == 2
    assert not _decision_answer(decision=begun, status=D.COMPUTED, send=1, raw_output="{}")
    assert _decision_answer(decision=begun, status=D.COMPUTED, send=2, raw_output="{}")
    assert not _decision_answer(decision=begun, status=D.COMPUTED, send=2, raw_output="{}")
    assert Decision.objects.get(pk=decision.pk).worker == "y@1"


def test_a_tick_sends_a_silent_nodes_decisions_to_the_live_one(settings, inline_send):
    """Heartbeats in memory: node y keeps sending them, node x stops after the tick began. What
    went to x (whose messages nobody takes) is sent to y; the tick completes without x."""
    settings.INFERENCE_HEARTBEAT_STORE = "memory"
    settings.INFERENCE_METRICS_PREFIX = f"test-{uuid.uuid4().hex[:8]}"  # a fresh store
    settings.INFERENCE_NODE_DOWN_S = 1.0
    settings.INFERENCE_NODES = [*settings.INFERENCE_NODES, "x", "y"]
    store = heartbeat_store()
    store.put(NodeHeartbeat(node="x", worker="x@1", sent_at=time.time()), keep_s=60)
    stop = threading.Event()

    def y_alive() -> None:
        while not stop.is_set():
            store.put(NodeHeartbeat(node="y", worker="y@1", sent_at=time.time()), keep_s=60)
            stop.wait(0.1)

    keeper = threading.Thread(target=y_alive, daemon=True)
    keeper.start()
    run = services.run_start(
        run=run_factory(town=small_town_factory(), nodes=["x", "y"], routing="round_robin")
    )
    sent: list[tuple[int, str, int]] = []

    def send(decision_id: int, node: str, number: int) -> None:
        sent.append((decision_id, node, number))
        if node == "y":
            inline_send(decision_id, node, number)

    try:
        tick = tick_run(run_id=run.pk, send=send, owner="test", poll_s=0.05)
    finally:
        stop.set()
        keeper.join()
    decisions = list(tick.decisions.all())
    assert {d.status for d in decisions} == {D.APPLIED}
    assert {d.node for d in decisions} == {"y"}
    to_x = {i for i, node, _ in sent if node == "x"}
    assert to_x, "round robin sent nothing to x while it was up"
    for d in decisions:
        assert d.attempts == 1
        assert d.num_sends == (2 if d.pk in to_x else 1)
