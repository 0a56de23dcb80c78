"""`python -m benchmarks retention-sweep --retention-interval 4096,2048,1024,dense`: one
shared-head workload under several retention policies, each on a fresh engine, plus prefix
caching off as the baseline, in one run; it prints reuse, lost tokens by reason, prefill time and
checkpoint memory per policy.

The talk measured its reuse on a prompt head of an exact size (2,247 or 3,362 tokens shared by
every decision). To share exactly `head_tokens`, each request's rendered town prompt gets a
token of its own inserted at that position (a distinct word per request): every pair of prompts
then agrees on exactly the first `head_tokens` tokens. The first request runs alone (it fills
the cache, like a tick's first decision); the others follow, `concurrency` at a time. Reuse and
lost tokens are reported per request over those later requests: the steady state.

The sweep models vLLM's rounding (no partial-block copy, no junctions, no shared prefill);
`--exact-reuse` turns those on and declares a cache breakpoint where the head ends, so the whole
head is reused at every interval.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from benchmarks.lib.cli import (
    ENGINE_ARGUMENTS,
    add_arguments,
    make_engine,
    run_meta,
    token_range,
    town_header,
    town_meta,
)
from benchmarks.lib.output import emit, progress
from benchmarks.lib.workload import Workload, build_workload, chat_tokenizer_for
from inference.engine import LLMEngine, RequestMetrics, SamplingParams

# One token each in the tokenizers we ship; the first token of each must differ.
_MARKER_WORDS = [
    " apple", " river", " cloud", " stone", " maple", " tiger", " ocean", " candle", " garden",
    " silver", " forest", " window", " letter", " bridge", " autumn", " planet", " violin",
    " harbor", " lantern", " meadow", " pepper", " rocket", " saddle", " tunnel",
]  # fmt: skip
BYTES_PER_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class IntervalRun:
    label: str  # "4096", "dense", "prompt-end", or "off" (prefix caching off)
    interval: int | None
    enable_prefix_caching: bool
    metrics: list[RequestMetrics]  # per request, in submission order
    outputs: list[tuple[list[int], str]]  # per request: output token ids and text
    wall_s: float
    num_checkpoints: int
    checkpoint_memory_bytes: int

    def summary(self) -> dict[str, float]:
        later = self.metrics[1:] or self.metrics

        def mean(field: str) -> float:
            return statistics.fmean(getattr(m, field) for m in later)

        prompt = sum(m.num_prompt_tokens for m in self.metrics)
        return {
            "token_hit_rate": sum(m.num_cached_tokens for m in self.metrics) / prompt,
            "reused": mean("num_cached_tokens"),
            "lost_to_retention": mean("num_lost_to_retention"),
            "lost_to_alignment": mean("num_lost_to_alignment"),
            "lost_to_eviction": mean("num_lost_to_eviction"),
            "cold": mean("num_cold_tokens"),
            "mean_prefill_s": mean("prefill_s"),
            "mean_prompt_tokens": mean("num_prompt_tokens"),
            "replayed": mean("num_replayed_tokens"),
            "checkpoint_memory_mib": self.checkpoint_memory_bytes / BYTES_PER_MIB,
            "num_checkpoints": self.num_checkpoints,
            "wall_s": self.wall_s,
        }


def parse_intervals(text: str) -> list[int | None]:
    """'4096,2048,dense,prompt-end' → [4096, 2048, None, 0]; ValueError on anything else."""
    intervals: list[int | None] = []
    for part in (p.strip() for p in text.split(",")):
        if part in ("dense", "none"):
            intervals.append(None)
        elif part == "prompt-end":
            intervals.append(0)
        elif part.isdigit():
            intervals.append(int(part))
        else:
            raise ValueError(
                f"--retention-interval: {part!r} is not a number of tokens, 'dense' or 'prompt-end'"
            )
    if not intervals:
        raise ValueError("--retention-interval needs at least one value")
    return intervals


def label_of(interval: int | None) -> str:
    return "dense" if interval is None else "prompt-end" if interval == 0 else str(interval)


def exact_head_prompts(tokenizer, workload: Workload, head_tokens: int) -> list[list[int]]:
    """The workload's prompts as token ids, sharing exactly `head_tokens` tokens pairwise."""
    chat = chat_tokenizer_for(tokenizer)
    prompts = [chat.apply_chat_template(messages) for messages in workload.requests]
    if workload.num_shared_prefix_tokens < head_tokens:
        raise ValueError(
            f"the workload's prompts share only {workload.num_shared_prefix_tokens} tokens, "
            f"fewer than the head of {head_tokens} asked for"
        )
    markers = list(dict.fromkeys(tokenizer.encode(word)[0] for word in _MARKER_WORDS))
    if len(prompts) > len(markers):
        raise ValueError(f"at most {len(markers)} requests in a retention sweep")
    return [[*p[:head_tokens], markers[i], *p[head_tokens:]] for i, p in enumerate(prompts)]


def run_interval(
    engine: LLMEngine,
    label: str,
    interval: int | None,
    prompts: list[list[int]],
    params: SamplingParams,
    concurrency: int,
) -> IntervalRun:
    """The first prompt alone, then the rest `concurrency` at a time, on a fresh engine."""
    # A one-token prompt fills no block: it warms the model and the grammar, caches nothing.
    engine.generate("Hi", dataclasses.replace(params, max_tokens=2, cache_breakpoints=None))
    start = time.perf_counter()
    outputs = engine.generate(prompts[0], params)
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="bench-worker") as pool:
        outputs += list(pool.map(lambda p: engine.generate(p, params)[0], prompts[1:]))
    wall_s = time.perf_counter() - start
    stats = engine.stats()
    return IntervalRun(
        label=label,
        interval=interval,
        enable_prefix_caching=engine.config.cache.enable_prefix_caching,
        metrics=[out.metrics for out in outputs],
        outputs=[(out.token_ids, out.text) for out in outputs],
        wall_s=wall_s,
        num_checkpoints=stats.num_checkpoints,
        checkpoint_memory_bytes=stats.checkpoint_memory_bytes,
    )


def run_sweep(
    make_engine: Callable[[bool, int | None], LLMEngine],
    workload_of: Callable[[LLMEngine], Workload],
    intervals: list[int | None],
    *,
    head_tokens: int,
    concurrency: int,
    max_tokens: int,
    progress: Callable[[str], None] = lambda message: None,
    breakpoint: int | None = None,
) -> tuple[list[IntervalRun], Workload]:
    """Prefix caching off, then each interval; a fresh engine each. The workload is built with
    the first engine's tokenizer."""
    runs: list[IntervalRun] = []
    workload: Workload | None = None
    prompts: list[list[int]] = []
    for caching, interval in [(False, None), *((True, i) for i in intervals)]:
        label = label_of(interval) if caching else "off"
        progress(f"{label}: loading a fresh engine")
        engine = make_engine(caching, interval)
        try:
            if workload is None:
                workload = workload_of(engine)
                prompts = exact_head_prompts(engine.tokenizer, workload, head_tokens)
            params = SamplingParams(
                max_tokens=max_tokens,
                temperature=0.0,
                json_schema=workload.schema,
                cache_breakpoints=[breakpoint] if breakpoint and caching else None,
            )
            progress(f"{label}: {len(prompts)} requests")
            runs.append(run_interval(engine, label, interval, prompts, params, concurrency))
        finally:
            engine.shutdown()
        progress(f"{label}: done in {runs[-1].wall_s:.1f} s")
    assert workload is not None
    return runs, workload


_ROWS = [
    ("token cache hit rate (all requests)", "token_hit_rate", "{:.1%}"),
    ("reused tokens / request", "reused", "{:.0f}"),
    ("lost to retention / request", "lost_to_retention", "{:.0f}"),
    ("lost to alignment / request", "lost_to_alignment", "{:.0f}"),
    ("lost to eviction / request", "lost_to_eviction", "{:.0f}"),
    ("cold tokens / request", "cold", "{:.0f}"),
    ("mean prompt tokens", "mean_prompt_tokens", "{:.0f}"),
    ("mean prefill (s)", "mean_prefill_s", "{:.2f}"),
    ("replayed tokens / request (approximate)", "replayed", "{:.0f}"),
    ("checkpoint memory (MiB)", "checkpoint_memory_mib", "{:.1f}"),
    ("checkpoints kept", "num_checkpoints", "{}"),
    ("wall time (s)", "wall_s", "{:.1f}"),
]


def format_sweep(runs: list[IntervalRun]) -> str:
    """One column per policy; per-request numbers are over the requests after the first."""
    summaries = [run.summary() for run in runs]
    lines = [
        "| retention interval | " + " | ".join(run.label for run in runs) + " |",
        "|---" * (len(runs) + 1) + "|",
    ]
    for label, key, fmt in _ROWS:
        lines.append(f"| {label} | " + " | ".join(fmt.format(s[key]) for s in summaries) + " |")
    off = next((s for run, s in zip(runs, summaries, strict=True) if run.label == "off"), None)
    if off and off["mean_prefill_s"] > 0:
        ratios = [s["mean_prefill_s"] / off["mean_prefill_s"] for s in summaries]
        lines.append("| prefill / off | " + " | ".join(f"{r:.2f}" for r in ratios) + " |")
    reference = next((run for run in runs if run.label == "off"), None)
    if reference is not None:
        agreement = [output_agreement(run, reference) for run in runs]
        lines.append(
            "| output tokens as off (greedy, until they differ) | "
            + " | ".join(f"{tokens:.1%}" for tokens, _ in agreement)
            + " |"
        )
        lines.append(
            "| identical answers as off | "
            + " | ".join(f"{answers:.1%}" for _, answers in agreement)
            + " |"
        )
    return "\n".join(lines)


def output_agreement(run: IntervalRun, reference: IntervalRun) -> tuple[float, float]:
    """Of the run's output tokens, the share that equal the reference's before the first
    difference; and the share of requests whose answer (text) is identical. Exact reuse gives
    100% / 100% (greedy); an approximate one (bounded replay) shows its error here."""
    same_tokens = total = same_answers = 0
    for (ours, text), (theirs, their_text) in zip(run.outputs, reference.outputs, strict=True):
        prefix = 0
        while prefix < min(len(ours), len(theirs)) and ours[prefix] == theirs[prefix]:
            prefix += 1
        same_tokens += prefix
        total += max(len(theirs), 1)
        same_answers += text == their_text
    return same_tokens / total, same_answers / max(len(run.outputs), 1)


def sweep_json(runs: list[IntervalRun]) -> dict[str, dict]:
    return {
        run.label: {
            **run.summary(),
            "interval": run.interval,
            "enable_prefix_caching": run.enable_prefix_caching,
            "per_request": [dataclasses.asdict(m) for m in run.metrics],
        }
        for run in runs
    }


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    add_arguments(
        parser, *ENGINE_ARGUMENTS, "requests", "concurrency", "head_tokens", "max_tokens", "seed"
    )
    parser.add_argument(
        "--retention-interval",
        required=True,
        help="comma-separated retention policies to compare, each a number of tokens (a "
        "multiple of the block size), 'dense' or 'prompt-end', e.g. 4096,2048,1024,dense; "
        "prompts then share exactly --head-tokens tokens",
    )
    parser.add_argument(
        "--prompt-tokens",
        type=token_range,
        default=None,
        help="LOW-HIGH: each prompt's size in tokens (default: a few hundred tokens past the head)",
    )
    parser.add_argument(
        "--exact-reuse",
        action="store_true",
        help="breakpoint at the head's end, partial-block copy and junctions on",
    )
    parser.add_argument(
        "--bounded-replay",
        action="store_true",
        help="DeepSeek's bounded replay on (DeepSeek-V4; approximate), with its agreement with "
        "the prefix-caching-off run",
    )
    add_arguments(parser, "json", "json_out")


def _system_tokens(head_tokens: int) -> int:
    """The shared system message's size: the head must fit in it, and it is ≥ 90% of its target."""
    return int(head_tokens / 0.9) + 16


def main(args: argparse.Namespace) -> int:
    start = run_meta(args)
    intervals = parse_intervals(args.retention_interval)
    prompt_tokens = args.prompt_tokens
    if prompt_tokens is None:
        low = _system_tokens(args.head_tokens) + 150
        prompt_tokens = (low, low + 300)

    def workload_of(engine: LLMEngine) -> Workload:
        return build_workload(
            chat_tokenizer_for(engine.tokenizer),
            num_requests=args.requests,
            head_tokens=_system_tokens(args.head_tokens),
            prompt_token_range=prompt_tokens,
            seed=args.seed,
        )

    exact = args.exact_reuse  # else vLLM's rounding: the talk's numbers
    flags = dict(
        enable_partial_block_reuse=exact,
        enable_junction_checkpoints=exact,
        enable_shared_prefill=exact,
    )
    if args.bounded_replay:
        flags["enable_bounded_replay"] = True
    runs, workload = run_sweep(
        lambda caching, interval: make_engine(args, caching, interval, **flags),
        workload_of,
        intervals,
        head_tokens=args.head_tokens,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        progress=progress,
        breakpoint=args.head_tokens if exact else None,
    )
    meta = town_meta(
        args, start, workload, ticks=1, weights=args.weights, kv_cache_dtype=args.kv_cache_dtype
    )
    meta["workload"]["head_tokens"] = args.head_tokens
    meta["workload"]["shared_prefix_tokens"] = args.head_tokens  # exactly: see the module doc
    meta["workload"]["prompt_tokens"] = [m.num_prompt_tokens for m in runs[0].metrics]
    data = {**meta, "retention_sweep": sweep_json(runs)}
    return emit(args, data, f"{town_header(meta)}\n{format_sweep(runs)}")
