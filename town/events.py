"""Run events: what the live view is told, stored with a per-run sequence number and sent to the
run's Channels group — the one place group sends happen.

Storage: a RunEvent row per event, written in the same transaction as the change it reports,
and sent to the group only once that transaction commits. `seq` is allocated under a lock on the
run's row (SQLite: its IMMEDIATE write lock), so seqs count 1, 2, 3, ... without gaps and commit
in that order: when event N reaches a consumer, events 1..N-1 are in the database already, and
the consumer can fill any gap (a group message dropped or overtaken) from there. A client that
reconnects says the last seq it saw and gets exactly what it missed (`events_after`).

Event kinds and their data (ids are database ids; every event also has seq, kind, at). An
entity has one shape, the REST API's: a decision is what GET /api/decisions/ lists for it
(town/api/serializers.py: DecisionSerializer), a summary what a run's `summary` says.
  decision.started   the decision, just sent to its node: the resident is thinking
  decision.answered  the decision, as soon as its answer is stored (computed: the resident has
                     decided, with its action, target and reason; or failed / timed out), while
                     the tick still waits for the others
  decision.applied   the decision, applied to the town when the whole tick is in
  resident.moved     resident_id, from_place_id, to_place_id, tick_index
  tick.advanced      tick_index, num_ticks_done, clock, open_place_ids, residents, summary
  run.state          status, num_ticks_done, num_steps_pending
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.db.models import Max

from town.api.serializers import DecisionSerializer, RunSummarySerializer
from town.models import Decision, Run, RunEvent, Tick
from town.rules.world import World
from town.selectors import run_clock, run_summary

logger = logging.getLogger(__name__)

DECISION_STARTED = "decision.started"
DECISION_ANSWERED = "decision.answered"
DECISION_APPLIED = "decision.applied"
# What the live page's feed lists: each decision once answered, again once applied.
FEED_KINDS = (DECISION_ANSWERED, DECISION_APPLIED)
RESIDENT_MOVED = "resident.moved"
TICK_ADVANCED = "tick.advanced"
RUN_STATE = "run.state"

# The consumer's handler for group messages: Channels maps type "run.event" to `run_event`.
GROUP_MESSAGE_TYPE = "run.event"


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def event_message(event: RunEvent) -> dict[str, Any]:
    """An event as the WebSocket client receives it."""
    return {
        "seq": event.seq,
        "kind": event.kind,
        "at": event.created_at.isoformat(),
        "data": event.data,
    }


def _group_send(run_id: int, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(
            run_group(run_id), {"type": GROUP_MESSAGE_TYPE, "event": message}
        )
    except Exception as exc:
        # The event is stored: connected clients get it with the next event (gap fill) or
        # when they reconnect. The town must not stop because the channel layer hiccupped.
        logger.warning("run %s: event %s not broadcast (%s)", run_id, message["seq"], exc)


def event_emit(*, run_id: int, kind: str, data: dict[str, Any]) -> RunEvent:
    """Store the event with the run's next seq; broadcast it once the transaction commits."""
    with transaction.atomic():
        # The lock orders concurrent emitters (tick loop, web buttons) on this run.
        Run.objects.select_for_update().filter(pk=run_id).values_list("pk").get()
        last = RunEvent.objects.filter(run_id=run_id).aggregate(last=Max("seq"))["last"] or 0
        event = RunEvent.objects.create(run_id=run_id, seq=last + 1, kind=kind, data=data)
        message = event_message(event)
        transaction.on_commit(lambda: _group_send(run_id, message))
    return event


def events_after(*, run_id: int, after_seq: int, up_to_seq: int | None = None) -> list[dict]:
    """The run's events with after_seq < seq (<= up_to_seq), in order, as messages."""
    events = RunEvent.objects.filter(run_id=run_id, seq__gt=after_seq)
    if up_to_seq is not None:
        events = events.filter(seq__lte=up_to_seq)
    return [event_message(e) for e in events.order_by("seq")]


def last_seq(*, run_id: int) -> int:
    return RunEvent.objects.filter(run_id=run_id).aggregate(last=Max("seq"))["last"] or 0


# What each event says, built from the objects the services hold.


def decisions_data(decisions: list[Decision]) -> list[dict[str, Any]]:
    """Decisions as the REST API lists them (URLs relative: no request); give them with their
    tick and resident selected, or each costs two queries."""
    serialized = DecisionSerializer(decisions, many=True, context={"request": None}).data
    return [dict(d) for d in serialized]


def clock_data(*, run: Run, tick_index: int) -> dict[str, Any]:
    clock = run_clock(run=run, tick_index=tick_index)
    return {
        "tick_index": tick_index,
        "day": clock.day,
        "hhmm": clock.hhmm,
        "phase": clock.phase,
        "minute_of_day": clock.minute_of_day,
    }


def summary_data(*, run: Run) -> dict[str, Any]:
    return dict(RunSummarySerializer(run_summary(run=run)).data)


def run_state_data(run: Run) -> dict[str, Any]:
    return {
        "status": run.status,
        "num_ticks_done": run.num_ticks_done,
        "num_steps_pending": run.num_steps_pending,
    }


# The emission calls the services make.


def decision_started_emit(*, decision: Decision, tick_index: int) -> None:
    assert decision.tick.index == tick_index, (decision.tick.index, tick_index)
    (data,) = decisions_data([decision])
    event_emit(run_id=decision.run_id, kind=DECISION_STARTED, data=data)


def decision_answered_emit(*, decision_id: int) -> None:
    """Call inside the transaction that stored the answer: the event commits with it."""
    decision = Decision.objects.select_related("tick", "resident").get(pk=decision_id)
    (data,) = decisions_data([decision])
    event_emit(run_id=decision.run_id, kind=DECISION_ANSWERED, data=data)


def run_state_emit(*, run: Run) -> None:
    event_emit(run_id=run.pk, kind=RUN_STATE, data=run_state_data(run))


def tick_finished_emit(
    *,
    run: Run,
    tick: Tick,
    decisions: list[Decision],
    world: World,
    places_before: dict[int, int],
    status_before: str,
) -> None:
    """A finished tick, in the order a viewer should see it: each decision, who moved where,
    the new clock and states, and the run's state if the tick ended the run."""
    applied = Decision.objects.filter(pk__in=[d.pk for d in decisions]).select_related(
        "tick", "resident"
    )
    for data in decisions_data(list(applied.order_by("resident_id"))):
        event_emit(run_id=run.pk, kind=DECISION_APPLIED, data=data)
    for resident in world.residents:
        before = places_before[resident.id]
        if resident.place_id != before:
            event_emit(
                run_id=run.pk,
                kind=RESIDENT_MOVED,
                data={
                    "resident_id": resident.id,
                    "from_place_id": before,
                    "to_place_id": resident.place_id,
                    "tick_index": tick.index,
                },
            )
    next_clock = run_clock(run=run, tick_index=run.num_ticks_done)
    event_emit(
        run_id=run.pk,
        kind=TICK_ADVANCED,
        data={
            "tick_index": tick.index,
            "num_ticks_done": run.num_ticks_done,
            "clock": clock_data(run=run, tick_index=run.num_ticks_done),
            "open_place_ids": [p.id for p in world.places if p.is_open(next_clock)],
            "residents": [
                {
                    "id": r.id,
                    "place_id": r.place_id,
                    "money": r.money,
                    "hunger": r.hunger,
                    "energy": r.energy,
                }
                for r in world.residents
            ],
            "summary": summary_data(run=run),
        },
    )
    if run.status != status_before:
        run_state_emit(run=run)
