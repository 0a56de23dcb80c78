"""What the town view reads: a run's snapshot (the state a live client starts from, with the seq
it is current to), a resident's detail panel, and a past run's replay, tick by tick.

Plain dicts, ready for JSON; the consumer and the views only pass them on. Each entity (run,
place, resident, decision, summary) has the REST API's shape, from its serializer
(town/api/serializers.py), with only what the live view adds (a place's is_open at the tick, a
resident's thinking); the page's JS (static/town/) reads those names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import OuterRef, Q, Subquery

from town.api.serializers import PlaceSerializer, ResidentSerializer, RunSerializer
from town.events import (
    FEED_KINDS,
    clock_data,
    decisions_data,
    event_message,
    last_seq,
)
from town.models import Decision, Memory, Place, Resident, ResidentState, Run, RunEvent, Tick
from town.rules.clock import Clock
from town.rules.world import PlaceView
from town.selectors import RunSummary, place_view, run_clock, run_summary

NUM_FEED_EVENTS = 30
NUM_DETAIL_MEMORIES = 8
NUM_DETAIL_DECISIONS = 5
# Sent and not answered yet: the resident is thinking. An answered decision shows what the
# resident decided (its decision.answered event) until the tick applies it.
THINKING = (Decision.Status.QUEUED, Decision.Status.RUNNING)
UNANSWERED = (Decision.Status.PENDING, *THINKING)


def run_header(run: Run, *, summary: RunSummary | None = None) -> dict[str, Any]:
    """The run as the REST API gives it (URLs relative: no request); `summary` when the caller
    has it already, else it is read."""
    context: dict[str, Any] = {"request": None}
    if summary is not None:
        context["summaries"] = {run.pk: summary}
    return dict(RunSerializer(run, context=context).data)


def _place_views(run: Run) -> list[tuple[Place, PlaceView]]:
    places = Place.objects.filter(town_id=run.town_id).order_by("id")
    return [(place, place_view(place, frozenset())) for place in places]


def places_data(*, run: Run, tick_index: int) -> list[dict[str, Any]]:
    """The places as the REST API gives them, each open or not at the run's tick."""
    clock = run_clock(run=run, tick_index=tick_index)
    return [
        {**PlaceSerializer(place).data, "is_open": view.is_open(clock)}
        for place, view in _place_views(run)
    ]


def _open_place_ids(views: list[tuple[Place, PlaceView]], clock: Clock) -> list[int]:
    return [place.id for place, view in views if view.is_open(clock)]


def residents_data(
    residents: Iterable[Resident], states: Iterable[ResidentState] = ()
) -> list[dict[str, Any]]:
    """Residents as the REST API gives them, each with its `state` in the run (select the
    states' place: its name is part of it)."""
    by_resident = {state.resident_id: state for state in states}
    context = {"states": by_resident}
    return [dict(r) for r in ResidentSerializer(list(residents), many=True, context=context).data]


def run_snapshot(*, run_id: int) -> dict[str, Any]:
    """The run as it stands, current to event `seq`: every state change comes with an event
    written under the run's row lock, so holding that lock here keeps state and seq together."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        seq = last_seq(run_id=run_id)
        open_tick = run.ticks.filter(status=Tick.Status.DECIDING).first()
        thinking = set()
        if open_tick is not None:
            thinking = set(
                open_tick.decisions.filter(status__in=THINKING).values_list(
                    "resident_id", flat=True
                )
            )
        states = list(
            ResidentState.objects.filter(run=run)
            .select_related("resident", "place")
            .order_by("resident_id")
        )
        latest = _latest_decisions(run=run)
        residents = [
            {**r, "thinking": r["id"] in thinking, "latest_decision": latest.get(r["id"])}
            for r in residents_data([s.resident for s in states], states)
        ]
        feed_events = _feed_events(run=run, up_to_seq=seq)
        header = run_header(run, summary=run_summary(run=run))
        return {
            "type": "snapshot",
            "seq": seq,
            "run": header,
            "clock": clock_data(run=run, tick_index=run.num_ticks_done),
            "places": places_data(run=run, tick_index=run.num_ticks_done),
            "residents": residents,
            "feed": feed_events,
            "summary": header["summary"],
        }


def _latest_decisions(*, run: Run) -> dict[int, dict[str, Any]]:
    """Each resident's newest answered decision (applied, or waiting for its tick), by resident
    id: what the page shows the resident last decided until its next answer comes."""
    answered = Decision.objects.filter(run=run).exclude(status__in=UNANSWERED)
    newest = answered.filter(resident_id=OuterRef("resident_id")).order_by("-tick__index")
    ids = ResidentState.objects.filter(run=run).annotate(newest=Subquery(newest.values("pk")[:1]))
    decisions = Decision.objects.filter(pk__in=ids.values("newest")).select_related(
        "tick", "resident"
    )
    return {d["resident"]: d for d in decisions_data(list(decisions))}


def _feed_events(*, run: Run, up_to_seq: int) -> list[dict[str, Any]]:
    """The feed's last NUM_FEED_EVENTS decisions, oldest first, each as its newest event (a
    decision is answered, then applied: two events, one line in the feed)."""
    events = RunEvent.objects.filter(run=run, kind__in=FEED_KINDS, seq__lte=up_to_seq)
    newest: dict[int, dict[str, Any]] = {}
    for event in events.order_by("-seq")[: 2 * NUM_FEED_EVENTS]:
        newest.setdefault(event.data["id"], event_message(event))
        if len(newest) == NUM_FEED_EVENTS:
            break
    return sorted(newest.values(), key=lambda e: e["seq"])


def resident_detail(*, run: Run, resident_id: int) -> dict[str, Any] | None:
    """The side panel of one resident: state, likes, memories, last decisions with numbers."""
    state = (
        ResidentState.objects.filter(run=run, resident_id=resident_id)
        .select_related("resident", "place")
        .first()
    )
    if state is None:
        return None
    memories = Memory.objects.filter(
        Q(run=run) | Q(run__isnull=True), resident_id=resident_id
    ).order_by("-id")[:NUM_DETAIL_MEMORIES]
    decisions = (
        Decision.objects.filter(run=run, resident_id=resident_id, status=Decision.Status.APPLIED)
        .select_related("tick", "resident")
        .order_by("-tick__index")[:NUM_DETAIL_DECISIONS]
    )
    (resident,) = residents_data([state.resident], [state])
    return {
        **resident,
        "memories": [m.text for m in memories],
        "decisions": decisions_data(list(decisions)),
    }


def _replay_memories(run: Run) -> dict[str, list[dict[str, Any]]]:
    """Each resident's memories, most recent first, with the tick that made them (None: a
    background memory), so a frame can show only those made before it."""
    memories = Memory.objects.filter(Q(run=run) | Q(run__isnull=True), resident__town=run.town)
    by_resident: dict[str, list[dict[str, Any]]] = {}
    for m in memories.order_by("-id"):
        by_resident.setdefault(str(m.resident_id), []).append(
            {"tick_index": m.tick_index, "text": m.text}
        )
    return by_resident


def run_replay(*, run: Run) -> dict[str, Any]:
    """Every finished tick of the run as a frame: the clock, each resident's state as that
    tick began (what its prompt saw, kept on its Decision) and the tick's decisions; then a
    last frame with the state after the last finished tick. Memories carry their tick, so a
    frame shows those its residents had."""
    residents = {r.id: r for r in Resident.objects.filter(town_id=run.town_id).order_by("id")}
    views = _place_views(run)
    ticks = list(run.ticks.filter(status=Tick.Status.DONE).order_by("index"))
    decisions = (
        Decision.objects.filter(tick__in=ticks)
        .select_related("tick", "resident")
        .order_by("tick_id", "resident_id")
    )
    by_tick: dict[int, list[Decision]] = {}
    for decision in decisions:
        by_tick.setdefault(decision.tick_id, []).append(decision)
    frames = []
    for tick in ticks:
        tick_decisions = by_tick.get(tick.pk, [])
        frames.append(
            {
                "tick_index": tick.index,
                "clock": clock_data(run=run, tick_index=tick.index),
                "open_place_ids": _open_place_ids(views, run_clock(run=run, tick_index=tick.index)),
                "states": {
                    str(d.resident_id): {
                        k: d.resident_state[k] for k in ("place_id", "money", "hunger", "energy")
                    }
                    for d in tick_decisions
                },
                "decisions": decisions_data(tick_decisions),
            }
        )
    end_index = ticks[-1].index + 1 if ticks else 0
    end_states = {
        str(s.resident_id): {
            "place_id": s.place_id,
            "money": s.money,
            "hunger": s.hunger,
            "energy": s.energy,
        }
        for s in ResidentState.objects.filter(run=run).order_by("resident_id")
    }
    open_tick = run.ticks.filter(index=end_index).first()
    if open_tick is not None:
        # A tick begun after the last finished one saw the state right after it.
        for d in open_tick.decisions.all():
            end_states[str(d.resident_id)] = {
                k: d.resident_state[k] for k in ("place_id", "money", "hunger", "energy")
            }
    frames.append(
        {
            "tick_index": end_index,
            "clock": clock_data(run=run, tick_index=end_index),
            "open_place_ids": _open_place_ids(views, run_clock(run=run, tick_index=end_index)),
            "states": end_states,
            "decisions": [],
        }
    )
    return {
        "run": run_header(run),
        "places": places_data(run=run, tick_index=0),
        "residents": residents_data(residents.values()),
        "memories": _replay_memories(run),
        "frames": frames,
    }
