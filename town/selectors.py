"""Queries: a run's World at a tick, the runs the tick loop should advance, a run's summary."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Q, QuerySet

from town.models import Decision, Memory, Place, Resident, ResidentState, Run, Tick
from town.rules.actions import REPEAT_TICKS
from town.rules.clock import Clock, clock_at
from town.rules.diary import diary_lines
from town.rules.world import MenuItem, PlaceView, ResidentView, World

NUM_MEMORIES_IN_PROMPT = 10


def run_clock(*, run: Run, tick_index: int) -> Clock:
    return clock_at(
        start_minutes=run.start_minutes,
        minutes_per_tick=run.minutes_per_tick,
        tick_index=tick_index,
    )


def place_view(place: Place, household_ids: frozenset[int]) -> PlaceView:
    return PlaceView(
        id=place.id,
        name=place.name,
        name_ja=place.name_ja,
        kind=place.kind,
        description=place.description,
        opens_at=place.opens_at,
        closes_at=place.closes_at,
        capacity=place.capacity,
        menu=[MenuItem(**item) for item in place.menu],
        household_ids=household_ids if place.is_home else frozenset(),
    )


def _memory_texts(*, run: Run, resident: Resident) -> list[str]:
    memories = Memory.objects.filter(Q(run=run) | Q(run__isnull=True), resident=resident)
    texts = []
    for memory in memories.order_by("-id")[:NUM_MEMORIES_IN_PROMPT]:
        if memory.tick_index is None:
            texts.append(f"Before: {memory.text}")
        else:
            clock = run_clock(run=run, tick_index=memory.tick_index)
            texts.append(f"Day {clock.day} {clock.hhmm}: {memory.text}")
    return texts


def _recent_choices(*, run: Run, tick_index: int) -> dict[int, list[tuple[str, str]]]:
    """Each resident's carried-out (action, target) in the REPEAT_TICKS ticks before
    `tick_index`, newest first (a tick whose answer was not carried out breaks the run)."""
    choices: dict[int, list[tuple[str, str]]] = {}
    decisions = Decision.objects.filter(
        run=run, tick__index__lt=tick_index, tick__index__gte=tick_index - REPEAT_TICKS
    )
    rows = decisions.order_by("-tick__index").values_list(
        "resident_id", "tick__index", "action", "target", "valid"
    )
    for resident_id, index, action, target, valid in rows:
        earlier = choices.setdefault(resident_id, [])
        if len(earlier) == tick_index - 1 - index and valid:
            earlier.append((action, target))
    return choices


def world_load(*, run: Run, tick_index: int) -> World:
    """The town of `run` as it stands when tick `tick_index` begins."""
    residents = list(Resident.objects.filter(town_id=run.town_id).order_by("id"))
    households: dict[int, set[int]] = {}
    for resident in residents:
        households.setdefault(resident.home_id, set()).add(resident.id)
    places = [
        place_view(p, frozenset(households.get(p.id, ())))
        for p in Place.objects.filter(town_id=run.town_id).order_by("id")
    ]
    states = {s.resident_id: s for s in ResidentState.objects.filter(run=run)}
    recent = _recent_choices(run=run, tick_index=tick_index)
    views = []
    # A run may take part of the town's residents (the experiment's --residents): the others
    # are not in its world, but their homes stay theirs.
    for resident in (r for r in residents if r.id in states):
        state = states[resident.id]
        views.append(
            ResidentView(
                id=resident.id,
                name=resident.name,
                age=resident.age,
                occupation=resident.occupation,
                personality=resident.personality,
                likes=list(resident.likes),
                home_id=resident.home_id,
                workplace_id=resident.workplace_id,
                wage_per_hour=resident.wage_per_hour,
                place_id=state.place_id,
                money=state.money,
                hunger=state.hunger,
                energy=state.energy,
                visits={int(k): v for k, v in state.visits.items()},
                memories=_memory_texts(run=run, resident=resident),
                recent_choices=recent.get(resident.id, []),
            )
        )
    world = World(
        town_name=run.town.name,
        clock=run_clock(run=run, tick_index=tick_index),
        minutes_per_tick=run.minutes_per_tick,
        places=places,
        residents=views,
    )
    for view in views:
        view.diary = diary_lines(
            world=world, resident=view, seed=run.seed, num_chars=run.diary_chars
        )
    return world


def runs_due() -> QuerySet[Run]:
    """Runs the tick loop should advance now: running ones, and paused ones with a step asked."""
    return Run.objects.filter(
        Q(status=Run.Status.RUNNING) | Q(status=Run.Status.PAUSED, num_steps_pending__gt=0)
    ).order_by("id")


def tick_open(*, run: Run) -> Tick | None:
    """The tick that was begun but not finished (the loop stopped mid-tick), if any."""
    return run.ticks.filter(status=Tick.Status.DECIDING).order_by("index").first()


def tick_decisions(*, tick: Tick) -> list[Decision]:
    return list(tick.decisions.order_by("resident_id"))


def tick_failure(*, tick: Tick) -> str | None:
    """When no decision of the tick got an answer (each failed or timed out): that, with the
    first one's error, on one line; else None. (An answer with an impossible action is made.)"""
    decisions = tick_decisions(tick=tick)
    lost = (Decision.Status.FAILED, Decision.Status.TIMED_OUT)
    if not decisions or any(d.status not in lost for d in decisions):
        return None
    first = decisions[0]
    why = " ".join((first.error or first.status).split())
    return (
        f"run {tick.run_id}, tick {tick.index}: all {len(decisions)} decisions failed; "
        f"the first (decision {first.pk}): {why}"
    )


@dataclass(frozen=True, slots=True)
class RunSummary:
    """The talk's summary table (slide 15), over a run's computed decisions."""

    num_decisions: int
    num_valid: int
    num_retried: int
    token_cache_hit_rate: float  # cached / prompt tokens, 0..1
    mean_cached_tokens: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    mean_prefill_s: float
    mean_queue_s: float
    mean_decode_s: float
    median_e2e_s: float  # the app's: dispatched → computed
    median_engine_e2e_s: float

    def rows(self) -> list[tuple[str, str]]:
        return [
            (
                "decisions (valid / retried)",
                f"{self.num_decisions} ({self.num_valid} / {self.num_retried})",
            ),
            ("token cache hit rate", f"{100 * self.token_cache_hit_rate:.2f}%"),
            ("cached tokens, mean", f"{self.mean_cached_tokens:.2f}"),
            ("prompt tokens, mean", f"{self.mean_prompt_tokens:.2f}"),
            ("output tokens, mean", f"{self.mean_output_tokens:.2f}"),
            ("prefill, mean (s)", f"{self.mean_prefill_s:.3f}"),
            ("queue, mean (s)", f"{self.mean_queue_s:.3f}"),
            ("decode, mean (s)", f"{self.mean_decode_s:.3f}"),
            ("end-to-end, median (s)", f"{self.median_e2e_s:.3f}"),
            ("engine end-to-end, median (s)", f"{self.median_engine_e2e_s:.3f}"),
        ]


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


# What a summary reads of each computed decision.
_SUMMARY_FIELDS = (
    "valid",
    "retries",
    "num_prompt_tokens",
    "num_cached_tokens",
    "num_output_tokens",
    "prefill_s",
    "queue_s",
    "decode_s",
    "app_e2e_s",
    "engine_e2e_s",
)


def _summary(decisions: list[dict]) -> RunSummary:
    prompt = [d["num_prompt_tokens"] for d in decisions]
    cached = [d["num_cached_tokens"] or 0 for d in decisions]
    return RunSummary(
        num_decisions=len(decisions),
        num_valid=sum(1 for d in decisions if d["valid"]),
        num_retried=sum(1 for d in decisions if d["retries"]),
        token_cache_hit_rate=sum(cached) / sum(prompt) if sum(prompt) else 0.0,
        mean_cached_tokens=_mean(cached),
        mean_prompt_tokens=_mean(prompt),
        mean_output_tokens=_mean([d["num_output_tokens"] or 0 for d in decisions]),
        mean_prefill_s=_mean([d["prefill_s"] for d in decisions if d["prefill_s"] is not None]),
        mean_queue_s=_mean([d["queue_s"] for d in decisions if d["queue_s"] is not None]),
        mean_decode_s=_mean([d["decode_s"] for d in decisions if d["decode_s"] is not None]),
        median_e2e_s=_median([d["app_e2e_s"] for d in decisions if d["app_e2e_s"] is not None]),
        median_engine_e2e_s=_median(
            [d["engine_e2e_s"] for d in decisions if d["engine_e2e_s"] is not None]
        ),
    )


def run_summaries(*, run_ids: Iterable[int]) -> dict[int, RunSummary]:
    """The summaries of many runs (a page of the run list) from one query, whatever their
    number. Not SQL aggregates: medians have none on SQLite, and the same arithmetic as one
    run's summary keeps every number identical to it."""
    rows: dict[int, list[dict]] = {run_id: [] for run_id in run_ids}
    computed = Decision.objects.filter(run_id__in=list(rows), num_prompt_tokens__isnull=False)
    for row in computed.values("run_id", *_SUMMARY_FIELDS):
        rows[row["run_id"]].append(row)
    return {run_id: _summary(decisions) for run_id, decisions in rows.items()}


def run_summary(*, run: Run) -> RunSummary:
    return run_summaries(run_ids=[run.pk])[run.pk]
