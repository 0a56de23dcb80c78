"""Turning runs into numbers: a summary per run, the ratios against the targets, and the
two output forms (a text table, one JSON object)."""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass
from typing import Any

from benchmarks.lib.results import RunResult
from benchmarks.lib.workload import is_valid_decision


@dataclass(frozen=True, slots=True)
class RunSummary:
    name: str
    description: str
    num_requests: int
    wall_s: float
    requests_per_min: float
    token_cache_hit_rate: float  # cached / prompt tokens
    mean_cached_tokens: float
    mean_queue_s: float
    mean_prefill_s: float
    mean_decode_s: float
    median_e2e_s: float
    output_tokens_per_s: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    decode_s_per_token: float  # decode time over the tokens after the first
    num_valid_json: int | None  # None when the run had no schema
    # Speculative runs: accepted / drafted tokens, and output tokens per verification step of a
    # request (1 + accepted per step); None for the others.
    spec_acceptance_rate: float | None = None
    spec_tokens_per_step: float | None = None
    # Decode with no prompt chunk in its steps (steady_decode), at the run's concurrency and
    # alone; None for the runs that did not measure it.
    steady_decode_s_per_token: float | None = None
    steady_decode_single_s_per_token: float | None = None


@dataclass(frozen=True, slots=True)
class Ratio:
    name: str
    value: float | None  # None when a run it needs was skipped
    target: float
    higher_is_better: bool

    @property
    def passed(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.target if self.higher_is_better else self.value <= self.target


def summarize(run: RunResult) -> RunSummary:
    records = run.records
    if not records:
        raise ValueError(f"run {run.name!r} has no requests to summarize")
    prompt = sum(r.num_prompt_tokens for r in records)
    output = sum(r.num_output_tokens for r in records)
    decode_steps = sum(max(r.num_output_tokens - 1, 0) for r in records)
    valid = None
    if run.schema is not None:
        valid = sum(is_valid_decision(r.text, run.schema) for r in records)
    stats = run.engine_stats or {}
    acceptance = tokens_per_step = None
    if stats.get("num_spec_verifications"):
        acceptance = stats["num_accepted_tokens"] / max(stats["num_draft_tokens"], 1)
        tokens_per_step = 1 + stats["num_accepted_tokens"] / stats["num_spec_verifications"]
    return RunSummary(
        name=run.name,
        description=run.description,
        num_requests=len(records),
        wall_s=run.wall_s,
        requests_per_min=60.0 * len(records) / run.wall_s,
        token_cache_hit_rate=sum(r.num_cached_tokens for r in records) / prompt,
        mean_cached_tokens=statistics.fmean(r.num_cached_tokens for r in records),
        mean_queue_s=statistics.fmean(r.queue_s for r in records),
        mean_prefill_s=statistics.fmean(r.prefill_s for r in records),
        mean_decode_s=statistics.fmean(r.decode_s for r in records),
        median_e2e_s=statistics.median(r.e2e_s for r in records),
        output_tokens_per_s=output / run.wall_s,
        mean_prompt_tokens=prompt / len(records),
        mean_output_tokens=output / len(records),
        decode_s_per_token=sum(r.decode_s for r in records) / decode_steps if decode_steps else 0.0,
        num_valid_json=valid,
        spec_acceptance_rate=acceptance,
        spec_tokens_per_step=tokens_per_step,
        steady_decode_s_per_token=run.steady_decode_s_per_token,
        steady_decode_single_s_per_token=run.steady_decode_single_s_per_token,
    )


def invalid_outputs(run: RunResult) -> list[dict[str, str]]:
    """The outputs of a schema run that do not parse or validate, with why they ended."""
    if run.schema is None:
        return []
    return [
        {"text": r.text, "finish_reason": r.finish_reason}
        for r in run.records
        if not is_valid_decision(r.text, run.schema)
    ]


def ratios(summaries: dict[str, RunSummary], ticks: int = 1, concurrency: int = 4) -> list[Ratio]:
    """The issues' targets (and jump-forward's gain), from the runs that were run; against
    llama.cpp (one request at a time): requests/min ≥ 1.5× on the one-tick workload, ≥ 2× on
    the two-tick one, aggregate decode tokens/s at `concurrency` in flight ≥ 2× its
    single-stream rate and per request ≥ 0.5× of it."""

    def ratio(top: str, field: str, bottom: str) -> float | None:
        if top not in summaries or bottom not in summaries:
            return None
        denominator = getattr(summaries[bottom], field)
        return getattr(summaries[top], field) / denominator if denominator else None

    # Not targets: the main run against the same run with other weights (--weights a,b).
    other_weights = [
        Ratio(f"cached_over_{name}_{field}", ratio("cached", field, name), 1.0, higher)
        for name in summaries
        if name.startswith("cached_")
        for field, higher in (("requests_per_min", True), ("decode_s_per_token", False))
    ]
    return [
        Ratio("engine_vs_transformers_requests_per_min",
              ratio("cached", "requests_per_min", "transformers"), 5.0, True),
        Ratio("prefill_cached_over_uncached",
              ratio("cached", "mean_prefill_s", "uncached"), 0.40, False),
        Ratio("decode_per_token_schema_over_no_schema",
              ratio("cached", "decode_s_per_token", "no_schema"), 1.10, False),
        # Not one of the targets: what jump-forward buys (it must never cost).
        Ratio("jump_forward_requests_per_min_over_without",
              ratio("cached", "requests_per_min", "no_jump"), 1.0, True),
        # Nor this: what reading the decoding sequences' contexts window by window buys.
        Ratio("decode_windows_decode_per_token_over_span_by_span",
              ratio("cached", "decode_s_per_token", "no_windows"), 1.0, False),
        # Speculative decoding's speed-up (issue 19 item 3): same workload, same process.
        Ratio("ngram_requests_per_min_over_cached",
              ratio("ngram", "requests_per_min", "cached"), 1.0, True),
        Ratio("ngram_decode_per_token_over_cached",
              ratio("ngram", "decode_s_per_token", "cached"), 1.0, False),
        Ratio("ngram_no_schema_decode_per_token_over_no_schema",
              ratio("ngram_no_schema", "decode_s_per_token", "no_schema"), 1.0, False),
        Ratio("mtp_decode_per_token_over_cached",
              ratio("mtp", "decode_s_per_token", "cached"), 1.0, False),
        Ratio("engine_vs_llamacpp_requests_per_min",
              ratio("cached", "requests_per_min", "llamacpp"), 2.0 if ticks == 2 else 1.5, True),
        Ratio("engine_aggregate_decode_vs_llamacpp_single_stream",
              _times(ratio("llamacpp", "decode_s_per_token", "cached"), concurrency), 2.0, True),
        Ratio("engine_per_request_decode_vs_llamacpp",
              ratio("llamacpp", "decode_s_per_token", "cached"), 0.5, True),
        # The same two with the engine's decode alone (steady_decode): its step, not the
        # prompt chunks of the requests starting beside it; llama.cpp's is already alone.
        Ratio("engine_steady_aggregate_decode_vs_llamacpp_single_stream",
              _times(_over(summaries, "llamacpp", "decode_s_per_token", "cached",
                           "steady_decode_s_per_token"), concurrency), 2.0, True),
        Ratio("engine_steady_per_request_decode_vs_llamacpp",
              _over(summaries, "llamacpp", "decode_s_per_token", "cached",
                    "steady_decode_s_per_token"), 0.5, True),
        *other_weights,
    ]  # fmt: skip


def _times(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _over(summaries, top: str, top_field: str, bottom: str, bottom_field: str) -> float | None:
    """summaries[top].top_field / summaries[bottom].bottom_field, None if either is missing."""
    if top not in summaries or bottom not in summaries:
        return None
    numerator = getattr(summaries[top], top_field)
    denominator = getattr(summaries[bottom], bottom_field)
    return numerator / denominator if numerator and denominator else None


def to_json(
    meta: dict[str, Any],
    runs: list[RunResult],
    summaries: dict[str, RunSummary],
    ticks: int = 1,
    concurrency: int = 4,
) -> str:
    return json.dumps(
        {
            **meta,
            "runs": {
                run.name: {
                    **dataclasses.asdict(summaries[run.name]),
                    "notes": run.notes,
                    "engine_stats": run.engine_stats,
                    "sample_output": run.records[0].text,
                    "invalid_outputs": invalid_outputs(run),
                }
                for run in runs
            },
            "ratios": {
                r.name: {"value": r.value, "target": r.target, "passed": r.passed}
                for r in ratios(summaries, ticks, concurrency)
            },
        },
        ensure_ascii=False,
        indent=2,
    )


_ROWS = [
    ("completed requests/min", "requests_per_min", "{:.2f}"),
    ("token cache hit rate", "token_cache_hit_rate", "{:.1%}"),
    ("mean cached tokens", "mean_cached_tokens", "{:.0f}"),
    ("mean queue (s)", "mean_queue_s", "{:.2f}"),
    ("mean prefill (s)", "mean_prefill_s", "{:.2f}"),
    ("mean decode (s)", "mean_decode_s", "{:.2f}"),
    ("median end-to-end (s)", "median_e2e_s", "{:.2f}"),
    ("output tokens/s", "output_tokens_per_s", "{:.1f}"),
    ("mean prompt tokens", "mean_prompt_tokens", "{:.0f}"),
    ("mean output tokens", "mean_output_tokens", "{:.1f}"),
    ("decode per token (ms)", "decode_s_per_token", "ms"),
    ("decode alone, {c} in flight, per token (ms)", "steady_decode_s_per_token", "ms"),
    ("decode alone, 1 in flight, per token (ms)", "steady_decode_single_s_per_token", "ms"),
    ("draft acceptance rate", "spec_acceptance_rate", "{:.1%}"),
    ("tokens per verification step", "spec_tokens_per_step", "{:.2f}"),
    ("requests", "num_requests", "{}"),
    ("wall time (s)", "wall_s", "{:.1f}"),
]


def format_table(
    runs: list[RunResult], summaries: dict[str, RunSummary], ticks: int = 1, concurrency: int = 4
) -> str:
    """A markdown table, one column per run, then the valid-JSON counts, notes and ratios."""
    names = [run.name for run in runs]
    lines = ["| metric | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, field, fmt in _ROWS:
        cells = [_cell(getattr(summaries[n], field), fmt) for n in names]
        lines.append(f"| {label.format(c=concurrency)} | " + " | ".join(cells) + " |")
    valid = [
        "n/a (no schema)" if s.num_valid_json is None else f"{s.num_valid_json}/{s.num_requests}"
        for s in (summaries[n] for n in names)
    ]
    lines.append("| valid JSON outputs | " + " | ".join(valid) + " |")
    lines.append("")
    lines += [f"- {run.name}: {run.description}" for run in runs]
    lines += [f"- {run.name}: {note}" for run in runs for note in run.notes]
    lines += [f"- {run.name}, first output: {run.records[0].text!r}" for run in runs]
    lines += [
        f"- {run.name}, INVALID output ({bad['finish_reason']}): {bad['text']!r}"
        for run in runs
        for bad in invalid_outputs(run)
    ]
    lines.append("")
    for r in ratios(summaries, ticks, concurrency):
        sign = "≥" if r.higher_is_better else "≤"
        if r.value is None:
            lines.append(f"{r.name}: skipped (target {sign} {r.target:g})")
        else:
            verdict = "PASS" if r.passed else "FAIL"
            lines.append(f"{r.name}: {r.value:.3f} (target {sign} {r.target:g}) {verdict}")
    return "\n".join(lines)


def _cell(value: float | None, fmt: str) -> str:
    if value is None:
        return "–"
    return f"{value * 1000:.1f}" if fmt == "ms" else fmt.format(value)
