"""Sending a decision again: a message lost between the broker and a dying worker is replaced,
and of several deliveries only one computes at a time (town/services/decisions.py). The same on
real Celery workers and the real Redis broker is in test_tasks.py."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from tests.town.factories import run_factory, small_town_factory
from town import events, services
from town.models import Decision, RunEvent
from town.services.decisions import _decision_begin
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
