"""`python -m benchmarks restart`: the town's restart story. A worker answers tick 1, is stopped,
and a fresh one answers tick 2: its hit rate and median end-to-end, with the disk KV tier and
without, beside an engine that never stopped.

The workload is the town-shaped one (lib/workload.py): every resident's prompt is the shared head
plus its own part. Tick 2 asks each resident again with its history grown by one memory, so an
engine that kept tick 1's blocks reuses the shared head and the resident's own part. Each
tick's requests are submitted together, as a tick's fan-out is. Three runs, fresh engines:
- never stopped: one engine, tick 1 then tick 2;
- restart, no tiers: tick 1 on one engine, shut down; tick 2 on a fresh one;
- restart, disk tier: the same, both on one disk directory (the shared volume).
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.lib.cli import add_arguments, run_meta
from benchmarks.lib.output import emit, progress
from benchmarks.lib.workload import build_workload, chat_tokenizer_for
from inference.engine import EngineConfig, LLMEngine, SamplingParams

NEW_MEMORY = "- An hour passed; nothing else changed since the last decision.\n"


@dataclass(slots=True)
class TickResult:
    run: str
    hit_rate: float  # cached / prompt tokens, over the tick's requests
    median_e2e_s: float
    num_cached_tokens_disk: int


def grown(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """A resident's next prompt: the same, with one more memory before the question."""
    system, user = messages
    content = user["content"]
    cut = content.rindex("\nDecide what")
    return [system, {"role": "user", "content": content[:cut] + "\n" + NEW_MEMORY + content[cut:]}]


def _tick(engine: LLMEngine, prompts: list, params: SamplingParams, run: str) -> TickResult:
    outputs = engine.generate(prompts, params)
    metrics = [o.metrics for o in outputs]
    return TickResult(
        run,
        sum(m.num_cached_tokens for m in metrics) / sum(m.num_prompt_tokens for m in metrics),
        statistics.median(m.e2e_s for m in metrics),
        sum(m.num_cached_tokens_disk for m in metrics),
    )


def run_restart(
    model: str,
    *,
    num_residents: int,
    head_tokens: int,
    prompt_token_range: tuple[int, int],
    max_tokens: int,
    seed: int,
    progress: Callable[[str], None] = lambda message: None,
) -> list[TickResult]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    # The engines share the disk tier's files: one key for the run (each would draw its own).
    common = dict(model=model, max_num_batched_tokens=512, kv_disk_cache_key=secrets.token_hex(32))

    def engine(**overrides) -> LLMEngine:
        return LLMEngine(EngineConfig(**common, **overrides))

    results = []
    with tempfile.TemporaryDirectory(prefix="kv-restart-bench-") as directory:
        for run, tiers in (
            ("never stopped", None),
            ("restart, no tiers", None),
            ("restart, disk tier", directory),
        ):
            progress(f"restart: {run}: tick 1")
            first = engine(kv_disk_cache_dir=tiers)
            workload = build_workload(
                chat_tokenizer_for(first.tokenizer),
                num_requests=num_residents,
                head_tokens=head_tokens,
                prompt_token_range=prompt_token_range,
                seed=seed,
            )
            tick2 = [grown(messages) for messages in workload.requests]
            try:
                first.generate(workload.requests, params)
                if run == "never stopped":
                    results.append(_tick(first, tick2, params, run))
                    continue
                assert first.flush_kv_tiers(600), "the writer did not finish"
            finally:
                first.shutdown()
            progress(f"restart: {run}: a fresh engine, tick 2")
            second = engine(kv_disk_cache_dir=tiers)
            try:
                results.append(_tick(second, tick2, params, run))
            finally:
                second.shutdown()
            progress(f"restart: {run}: hit rate {results[-1].hit_rate:.3f}")
    return results


def format_restart(results: list[TickResult]) -> str:
    lines = [f"{'tick 2 after':<22}{'hit rate':>10}{'median e2e (s)':>16}{'from disk':>11}"]
    for r in results:
        lines.append(
            f"{r.run:<22}{100 * r.hit_rate:>9.1f}%{r.median_e2e_s:>16.3f}"
            f"{r.num_cached_tokens_disk:>11}"
        )
    base = results[0]
    for r in results[1:]:
        lines.append(
            f"{r.run}: {100 * (base.hit_rate - r.hit_rate):.1f} points below never stopped "
            "(target ≤ 2 with the disk tier)"
        )
    return "\n".join(lines)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    add_arguments(
        parser,
        "model",
        "requests",
        "head_tokens",
        "prompt_tokens",
        "max_tokens",
        "seed",
        "json",
        "json_out",
    )


def main(args: argparse.Namespace) -> int:
    meta = run_meta(args)
    results = run_restart(
        args.model,
        num_residents=args.requests,
        head_tokens=args.head_tokens,
        prompt_token_range=args.prompt_tokens,
        max_tokens=args.max_tokens,
        seed=args.seed,
        progress=progress,
    )
    return emit(args, {**meta, "runs": [vars_of(r) for r in results]}, format_restart(results))


def vars_of(result: TickResult) -> dict:
    return {name: getattr(result, name) for name in result.__slots__}
