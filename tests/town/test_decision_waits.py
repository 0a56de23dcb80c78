"""A decision no worker began yet: waiting behind others on a live node is expected (INFO, not
sent again); sent again, with a WARNING, only when its message may be lost
(town/services/decisions.py: decision_wait_verdict). And each decision's engine priority."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from inference.fleet.health import NodeHeartbeat, NodeState, heartbeat_store
from tests.town.factories import run_factory, small_town_factory
from town import services
from town.models import Decision
from town.services.decision_requests import decision_request
from town.simulation import InlineSend, tick_run

pytestmark = pytest.mark.django_db(transaction=True)

D = Decision.Status


def queued_decision(*, waited_s: float) -> Decision:
    run = services.run_start(run=run_factory(town=small_town_factory()))
    decision = services.tick_begin(run=run).decisions.order_by("resident_id").first()
    services.decision_dispatch(decision=decision, send=lambda *args: None)
    decision.dispatched_at = timezone.now() - timedelta(seconds=waited_s)
    return decision


def live(decision: Decision, **load) -> NodeState:
    return NodeState(node=decision.node, is_up=True, workers=("w@1",), **load)


def test_a_decision_behind_others_on_a_live_node_waits():
    decision = queued_decision(waited_s=90)
    verdict = services.decision_wait_verdict(
        decision=decision, state=live(decision, num_running=4, num_queued=3)
    )
    assert not verdict.resend and "waits behind" in verdict.why and "3 queued" in verdict.why


def test_a_worker_silent_since_the_send_means_the_message_may_be_lost():
    decision = queued_decision(waited_s=90)
    died_at = decision.dispatched_at.timestamp() + 5
    state = live(decision, num_queued=3, silent_workers=(("w@2", died_at),))
    verdict = services.decision_wait_verdict(decision=decision, state=state)
    assert verdict.resend and "worker w@2" in verdict.why
    # One that went silent long before the send took nothing of it.
    state = live(decision, num_queued=3, silent_workers=(("w@2", died_at - 600),))
    assert not services.decision_wait_verdict(decision=decision, state=state).resend


def test_a_live_node_with_nothing_queued_or_no_heartbeat_at_all_means_a_resend():
    decision = queued_decision(waited_s=90)
    idle = services.decision_wait_verdict(decision=decision, state=live(decision, num_running=2))
    assert idle.resend and "message is lost" in idle.why
    unknown = services.decision_wait_verdict(decision=decision, state=None)
    assert unknown.resend and "no heartbeat" in unknown.why


def test_a_tick_on_a_busy_live_node_sends_nothing_twice_and_warns_of_nothing(settings, caplog):
    """Node b's heartbeats say it is alive with work queued; its worker begins each decision
    only after several resend periods (it is busy). No second send, no warning; INFO says why."""
    settings.INFERENCE_HEARTBEAT_STORE = "memory"
    settings.INFERENCE_METRICS_PREFIX = f"test-{uuid.uuid4().hex[:8]}"  # a fresh store
    settings.INFERENCE_NODES = [*settings.INFERENCE_NODES, "b"]
    settings.TOWN_DECISION_RESEND_S = 0.2
    store = heartbeat_store()
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            beat = NodeHeartbeat(node="b", worker="b@1", sent_at=time.time(), num_queued=3)
            store.put(beat, keep_s=60)
            stop.wait(0.1)

    keeper = threading.Thread(target=busy, daemon=True)
    keeper.start()
    run = services.run_start(run=run_factory(town=small_town_factory(), nodes=["b"]))
    inline = InlineSend(max_workers=4)
    sent: list[tuple[int, int]] = []

    def send_late(decision_id: int, node: str, number: int) -> None:
        sent.append((decision_id, number))
        threading.Timer(1.0, inline, (decision_id, node, number)).start()

    caplog.set_level(logging.INFO, logger="town.simulation")
    try:
        tick = tick_run(run_id=run.pk, send=send_late, owner="test", poll_s=0.05)
    finally:
        stop.set()
        keeper.join()
        inline.shutdown()
    decisions = list(tick.decisions.all())
    assert {d.status for d in decisions} == {D.APPLIED}
    assert all(d.num_sends == 1 for d in decisions) and all(n == 1 for _, n in sent)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not warnings, [r.getMessage() for r in warnings]
    waits = [r.getMessage() for r in caplog.records if "not sent again" in r.getMessage()]
    assert waits and all("waits behind the work of live node b" in m for m in waits)


def test_the_tick_loops_decisions_and_requested_ones_carry_their_priority(settings):
    settings.INFERENCE_PRIORITY_TICK = 4
    settings.INFERENCE_PRIORITY_REQUESTED = -1
    run = services.run_create(town=small_town_factory())
    tick = services.tick_begin(run=run)
    first, second = tick.decisions.order_by("resident_id")[:2]
    asked = decision_request(run=run, resident=first.resident, send=lambda *a: None, owner="t")
    services.decision_dispatch(decision=second, send=lambda *args: None)
    assert (asked.priority, second.priority) == (-1, 4)
    for decision in (asked, second):
        assert services.decision_compute(decision_id=decision.pk, worker="w", send=1)
        decision.refresh_from_db()
        assert decision.metrics["priority"] == decision.priority
