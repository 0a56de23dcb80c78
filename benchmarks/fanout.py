"""`python -m benchmarks fanout`: N requests sharing an uncached head, submitted at once (a town
tick fanning out).

Two fresh engines on the same prompts: one prefill per shared head on (the leader computes the
head and keeps a checkpoint where it ends; the others wait, then resume there), and off (each
request prefills on its own and reuses only what the cache holds when it is admitted). Reports
the engine's prefill-token count (ideally head + N × tail) and the mean TTFT of each, and their
ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.lib.cli import ENGINE_ARGUMENTS, add_arguments, make_engine, run_meta
from benchmarks.lib.output import emit, progress
from benchmarks.retention_sweep import parse_intervals
from inference.engine import LLMEngine, SamplingParams


@dataclass(slots=True)
class FanoutRun:
    label: str
    enable_shared_prefill: bool
    num_prefill_tokens: int
    mean_ttft_s: float
    wall_s: float
    reused: list[int]
    reuse_sources: dict[str, int]


def fanout_prompts(
    vocab_size: int, num_requests: int, head_tokens: int, tail_tokens: int, seed: int
) -> list[list[int]]:
    """Random token ids (a fresh head each seed, so nothing is cached): head + own tail."""
    rng = random.Random(seed)
    high = min(vocab_size, 200_000)
    head = [rng.randrange(1000, high) for _ in range(head_tokens)]
    return [
        head + [rng.randrange(1000, high) for _ in range(tail_tokens)] for _ in range(num_requests)
    ]


def run_fanout_once(
    engine: LLMEngine, label: str, prompts: list[list[int]], max_tokens: int
) -> FanoutRun:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    engine.generate([1000, 1001], SamplingParams(max_tokens=2))  # warm up; caches nothing
    before = engine.stats().num_prefill_tokens
    start = time.perf_counter()
    # One call: every request reaches the scheduler in the same step, as a tick's fan-out does
    # when its decisions are queued together (threads arriving a step apart would let the first
    # finish its prefill alone; the second then finds the junction, the rest resume there).
    outputs = engine.generate(prompts, params)
    wall_s = time.perf_counter() - start
    stats = engine.stats()
    return FanoutRun(
        label=label,
        enable_shared_prefill=engine.config.scheduler.enable_shared_prefill,
        num_prefill_tokens=stats.num_prefill_tokens - before,
        mean_ttft_s=statistics.mean(o.metrics.ttft_s for o in outputs),
        wall_s=wall_s,
        reused=[o.metrics.num_cached_tokens for o in outputs],
        reuse_sources={k: v for k, v in stats.reuse_sources.items() if k != "none" or v > 1},
    )


def run_fanout(
    make_engine: Callable[[bool], LLMEngine],
    *,
    num_requests: int,
    head_tokens: int,
    tail_tokens: int,
    max_tokens: int,
    seed: int,
    progress: Callable[[str], None] = lambda message: None,
) -> list[FanoutRun]:
    """Shared prefill on, then off; a fresh engine each, the same prompts."""
    runs = []
    for shared in (True, False):
        label = "one prefill per head" if shared else "each prefills (off)"
        progress(f"fanout, {label}: loading a fresh engine")
        engine = make_engine(shared)
        try:
            prompts = fanout_prompts(
                engine.structured.vocab_size, num_requests, head_tokens, tail_tokens, seed
            )
            runs.append(run_fanout_once(engine, label, prompts, max_tokens))
        finally:
            engine.shutdown()
        progress(f"fanout, {label}: done in {runs[-1].wall_s:.1f} s")
    return runs


def format_fanout(runs: list[FanoutRun], head_tokens: int, tail_tokens: int, n: int) -> str:
    ideal = head_tokens + n * tail_tokens
    lines = [
        f"{n} requests, head {head_tokens} + tail {tail_tokens} tokens (ideal prefill {ideal})"
    ]
    lines.append(f"{'run':<24}{'prefill tokens':>16}{'mean TTFT (s)':>16}{'wall (s)':>10}")
    for run in runs:
        lines.append(
            f"{run.label:<24}{run.num_prefill_tokens:>16}{run.mean_ttft_s:>16.3f}"
            f"{run.wall_s:>10.2f}"
        )
    on, off = runs
    lines.append(f"mean TTFT off / on: {off.mean_ttft_s / on.mean_ttft_s:.2f}x")
    return "\n".join(lines)


def fanout_json(runs: list[FanoutRun]) -> dict:
    on, off = runs
    return {
        "runs": [
            {
                "label": r.label,
                "enable_shared_prefill": r.enable_shared_prefill,
                "num_prefill_tokens": r.num_prefill_tokens,
                "mean_ttft_s": r.mean_ttft_s,
                "wall_s": r.wall_s,
                "reused": r.reused,
                "reuse_sources": r.reuse_sources,
            }
            for r in runs
        ],
        "ttft_ratio_off_over_on": off.mean_ttft_s / on.mean_ttft_s,
    }


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    add_arguments(
        parser,
        *ENGINE_ARGUMENTS,
        "requests",
        "head_tokens",
        "tail_tokens",
        "max_tokens",
        "seed",
        "json",
        "json_out",
    )
    parser.add_argument(
        "--retention-interval",
        default=None,
        help="the engines' retention policy: a number of tokens (a multiple of the block size), "
        "'dense' or 'prompt-end' (a list: its first)",
    )


def main(args: argparse.Namespace) -> int:
    """Run, then print a table (or JSON) and write --json-out."""
    meta = run_meta(args)
    interval = parse_intervals(args.retention_interval)[0] if args.retention_interval else None
    runs = run_fanout(
        lambda shared: make_engine(args, True, interval, enable_shared_prefill=shared),
        num_requests=args.requests,
        head_tokens=args.head_tokens,
        tail_tokens=args.tail_tokens,
        max_tokens=args.max_tokens,
        seed=args.seed,
        progress=progress,
    )
    data = {**meta, "fanout": fanout_json(runs)}
    text = format_fanout(runs, args.head_tokens, args.tail_tokens, args.requests)
    return emit(args, data, f"{data['command']}\n{text}")
