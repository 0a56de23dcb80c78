"""Selectors for the admin and the API: residents' current state, a run's chart series, and
the talk's summary table for several runs side by side (slide 15), with the differences.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from town.errors import TownError
from town.models import Decision, ResidentState, Run
from town.quality import TownQuality
from town.selectors import RunSummary, run_summary
from town.services.experiments import Experiment, StepResult


def resident_states(*, resident_ids: list[int], run_id: int | None) -> dict[int, ResidentState]:
    """Each resident's state in run `run_id`, or, without one, in the latest run of their town."""
    states = ResidentState.objects.filter(resident_id__in=resident_ids).select_related("place")
    if run_id is not None:
        return {s.resident_id: s for s in states.filter(run_id=run_id)}
    latest: dict[int, ResidentState] = {}
    for state in states.order_by("resident_id", "-run_id"):
        latest.setdefault(state.resident_id, state)
    return latest


def run_chart_data(*, run: Run) -> dict[str, Any]:
    """The series the run's admin page draws, as plain lists (JSON-ready).

    decisions: one point per computed decision, in the order they were answered, x = seconds
    since the run's first dispatch; ticks: the token cache hit rate per tick; lost: lost prompt
    tokens summed by reason.
    """
    rows = list(
        Decision.objects.filter(run=run, num_prompt_tokens__isnull=False)
        .order_by("computed_at", "id")
        .values(
            "id",
            "tick__index",
            "resident__name",
            "dispatched_at",
            "computed_at",
            "app_e2e_s",
            "engine_e2e_s",
            "prefill_s",
            "queue_s",
            "decode_s",
            "num_prompt_tokens",
            "num_cached_tokens",
            "lost_tokens",
        )
    )
    dispatched = [r["dispatched_at"] for r in rows if r["dispatched_at"] is not None]
    origin = min(dispatched) if dispatched else None
    decisions = []
    per_tick: dict[int, list[int]] = {}
    lost: dict[str, int] = {}
    for r in rows:
        when = r["computed_at"]
        x = (when - origin).total_seconds() if origin is not None and when is not None else None
        cached = r["num_cached_tokens"] or 0
        decisions.append(
            {
                "id": r["id"],
                "tick": r["tick__index"],
                "resident": r["resident__name"],
                "t_s": x,
                "e2e_s": r["app_e2e_s"],
                "engine_e2e_s": r["engine_e2e_s"],
                "prefill_s": r["prefill_s"],
                "queue_s": r["queue_s"],
                "decode_s": r["decode_s"],
                "prompt_tokens": r["num_prompt_tokens"],
                "cached_tokens": cached,
            }
        )
        totals = per_tick.setdefault(r["tick__index"], [0, 0])
        totals[0] += cached
        totals[1] += r["num_prompt_tokens"]
        for reason, tokens in (r["lost_tokens"] or {}).items():
            lost[reason] = lost.get(reason, 0) + int(tokens)
    ticks = [
        {"tick": index, "hit_rate": cached / prompt if prompt else 0.0}
        for index, (cached, prompt) in sorted(per_tick.items())
    ]
    return {"decisions": decisions, "ticks": ticks, "lost": dict(sorted(lost.items()))}


@dataclass(frozen=True, slots=True)
class CompareRow:
    label: str
    values: list[str]  # one per run, formatted
    changes: list[str]  # one per run after the first: against the first run ("" for the first)

    @property
    def cells(self) -> list[tuple[str, str]]:
        return list(zip(self.values, self.changes, strict=True))


# (label, RunSummary field, kind): kind "rate" differs in points, "value" in percent.
COMPARED = [
    ("token cache hit rate", "token_cache_hit_rate", "rate"),
    ("cached tokens, mean", "mean_cached_tokens", "value"),
    ("prefill, mean (s)", "mean_prefill_s", "value"),
    ("queue, mean (s)", "mean_queue_s", "value"),
    ("decode, mean (s)", "mean_decode_s", "value"),
    ("end-to-end, median (s)", "median_e2e_s", "value"),
    ("prompt tokens, mean", "mean_prompt_tokens", "value"),
]


def _format(value: float, kind: str) -> str:
    return f"{100 * value:.2f}%" if kind == "rate" else f"{value:,.3f}".rstrip("0").rstrip(".")


def _change(base: float, value: float, kind: str) -> str:
    if kind == "rate":
        return f"{100 * (value - base):+.2f} pt"
    if value == base:
        return "±0%"
    if base == 0:
        return "n/a (base 0)"
    return f"{100 * (value - base) / base:+.1f}%"


def runs_compare(*, runs: list[Run]) -> tuple[list[RunSummary], list[CompareRow]]:
    """The talk's summary rows for `runs` (in the order given), each against the first run."""
    summaries = [run_summary(run=run) for run in runs]
    rows = []
    for label, field, kind in COMPARED:
        values = [getattr(s, field) for s in summaries]
        rows.append(
            CompareRow(
                label=label,
                values=[_format(v, kind) for v in values],
                changes=[""] + [_change(values[0], v, kind) for v in values[1:]],
            )
        )
    return summaries, rows


def runs_baseline_first(*, runs: list[Run], baseline: str | None) -> list[Run]:
    """`runs` with the baseline run first (runs_compare sets each against the first); `baseline`
    is a run id as a query string gives it, None or "" for the first run. TownError when it
    is not one of the runs."""
    if not baseline:
        return runs
    by_id = {str(run.pk): run for run in runs}
    chosen = by_id.get(baseline.strip())
    if chosen is None:
        raise TownError(
            f"baseline={baseline!r} is not one of the compared runs ({', '.join(by_id)}); "
            f"pick one of them. Comparing against run {runs[0].pk}."
        )
    return [chosen, *(run for run in runs if run is not chosen)]


def runs_length_warning(*, runs: list[Run]) -> str:
    """Why runs that ticked a different number of times compare unlike with unlike; "" when
    they all did the same number of ticks."""
    if len({run.num_ticks_done for run in runs}) <= 1:
        return ""
    lengths = ", ".join(f"run {run.pk}: {run.num_ticks_done}" for run in runs)
    return (
        f"These runs differ in length (ticks done: {lengths}). Their numbers cover different "
        "stretches of the town's days and different cache warmth, so a difference is not the "
        "layout's alone: compare runs of the same length (ticks_target)."
    )


def experiment_table(*, experiment: Experiment) -> str:
    """The slide-15 table for an experiment's steps, as Markdown, with changes against step 1.

    Without sliding-window layers the retention interval changes nothing: the steps that only
    change it are marked, so run-to-run noise is not read as an effect."""
    results = experiment.steps
    summaries, rows = runs_compare(runs=[r.run for r in results])
    retention_only = (
        _retention_only_steps(results) if not experiment.has_sliding_window_layers else set()
    )
    heads = [
        f"step {r.step.number}{' (*)' if r.step.number in retention_only else ''}" for r in results
    ]
    lines = ["| | " + " | ".join(heads) + " |", "|---" * (len(results) + 1) + "|"]
    lines.append("| change | " + " | ".join(r.step.change for r in results) + " |")
    lines.append("| layout | " + " | ".join(r.step.layout for r in results) + " |")
    lines.append(
        "| retention interval | "
        + " | ".join(
            f"{r.retention_interval:,}" if r.retention_interval else "dense" for r in results
        )
        + " |"
    )
    lines.append("| run | " + " | ".join(str(r.run.pk) for r in results) + " |")
    for row in rows:
        cells = [v if not c or c.startswith("n/a") else f"{v} ({c})" for v, c in row.cells]
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    lost = [_mean_lost(run=r.run, reason="retention") for r in results]
    lines.append("| lost to retention, mean | " + " | ".join(f"{v:,.1f}" for v in lost) + " |")
    valid = [f"{s.num_valid}/{s.num_decisions}" for s in summaries]
    lines.append("| valid decisions | " + " | ".join(valid) + " |")
    if retention_only:
        marked = ", ".join(str(n) for n in sorted(retention_only))
        lines.append("")
        lines.append(
            f"(*) step {marked}: only the retention interval changed, and {experiment.model} has "
            "no sliding-window layers, so it changes nothing: every full block is reusable at "
            "any interval. Differences from the step before are run-to-run noise, not an effect."
        )
    return "\n".join(lines)


def _retention_only_steps(results: list[StepResult]) -> set[int]:
    return {
        cur.step.number
        for prev, cur in itertools.pairwise(results)
        if cur.step.layout == prev.step.layout and cur.step.best_engine == prev.step.best_engine
    }


def _mean_lost(*, run: Run, reason: str) -> float:
    rows = Decision.objects.filter(run=run, num_prompt_tokens__isnull=False).values_list(
        "lost_tokens", flat=True
    )
    values = [int((lost or {}).get(reason, 0)) for lost in rows]
    return sum(values) / len(values) if values else 0.0


def runs_quality_rows(*, runs: list[Run]) -> list[tuple[str, list[str]]]:
    """The decision-quality rows (town_quality) for `runs` side by side; [] when none of them
    was measured, '-' for a run that was not."""
    measured = [TownQuality.from_json(run.quality) for run in runs]
    if not any(measured):
        return []
    template = next(q for q in measured if q is not None)
    rows = []
    for i, (label, _) in enumerate(template.rows()):
        rows.append((label, [q.rows()[i][1] if q else "-" for q in measured]))
    return rows
