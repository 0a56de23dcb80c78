"""`python -m benchmarks tiers`: time to first token for a prompt whose head is cold, on disk,
in host memory or in the device pool (kv/tiers).

Each repetition uses a fresh head (random token ids; --head-tokens, default 1500) and a fresh
tail per timed prompt (--tail-tokens, default 500), one output token:
- cold: nothing cached (the engine with tiers on: its lookup misses, then it writes the blocks),
- device: the same head again, right after (the device pool has it),
- host: after unrelated prompts pushed the head out of the device pool (sized to hold about one
  prompt), the host tier has it,
- disk: a second engine (empty pool, disk tier only) on the same directory, as a restarted or
  other worker would be; the files were just written, so the OS page cache still holds them.
Reports the median TTFT of each, the cached tokens by tier (to show where the head came from),
and the head's cost: (TTFT - device TTFT) / (cold TTFT - device TTFT), the share of recomputing
the head that loading it costs (the issue's target: ≤ 20% from disk).
"""

from __future__ import annotations

import argparse
import random
import secrets
import statistics
import tempfile
from collections.abc import Callable

from benchmarks.lib.cli import add_arguments, run_meta
from benchmarks.lib.output import emit, progress
from inference.engine import EngineConfig, LLMEngine, SamplingParams

KINDS = ("cold", "disk", "host", "device")


def _tokens(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(1000, min(vocab, 49_000)) for _ in range(n)]


def run_tiers(
    model: str,
    *,
    head_tokens: int,
    tail_tokens: int,
    repeats: int,
    seed: int,
    progress: Callable[[str], None] = lambda message: None,
) -> dict:
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prompt_blocks = -(-(head_tokens + tail_tokens + 1) // 16)
    # The pool holds a bit more than one prompt: two unrelated prompts push a head out of it.
    common = dict(model=model, num_kv_blocks=prompt_blocks + 16, max_num_batched_tokens=512)
    common["kv_disk_cache_key"] = secrets.token_hex(32)  # the engines share the files
    results: dict[str, list] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="kv-tiers-bench-") as directory:
        progress("tiers: loading the engines")
        tiered = LLMEngine(
            EngineConfig(**common, kv_host_cache_bytes=4 << 30, kv_disk_cache_dir=directory)
        )
        reader = LLMEngine(EngineConfig(**common, kv_disk_cache_dir=directory))
        vocab = tiered.structured.vocab_size
        rng = random.Random(seed)
        try:
            tiered.generate([[1000, 1001]], params)  # warm up
            reader.generate([[1000, 1002]], params)
            for repeat in range(repeats):
                head = _tokens(rng, vocab, head_tokens)

                def timed(engine: LLMEngine, kind: str, head: list[int] = head) -> None:
                    prompt = head + _tokens(rng, vocab, tail_tokens)
                    metrics = engine.generate([prompt], params)[0].metrics
                    results[kind].append(metrics)
                    progress(f"tiers: {kind}: {_describe(metrics)}")

                progress(f"tiers: repeat {repeat + 1}/{repeats}")
                timed(tiered, "cold")
                timed(tiered, "device")
                assert tiered.flush_kv_tiers(600), "the writer did not finish"
                timed(reader, "disk")
                for _ in range(2):  # push the head out of the device pool
                    tiered.generate([_tokens(rng, vocab, head_tokens + tail_tokens)], params)
                assert tiered.flush_kv_tiers(600)
                timed(tiered, "host")
            stats = {name: vars_of(s) for name, s in tiered.stats().kv_tiers.items()}
            stats["disk (reader)"] = vars_of(reader.stats().kv_tiers["disk"])
        finally:
            tiered.shutdown()
            reader.shutdown()
    ttft = {kind: statistics.median(m.ttft_s for m in results[kind]) for kind in KINDS}
    head_cost = {
        kind: (ttft[kind] - ttft["device"]) / (ttft["cold"] - ttft["device"])
        for kind in ("disk", "host")
    }
    return {
        "model": model,
        "head_tokens": head_tokens,
        "tail_tokens": tail_tokens,
        "repeats": repeats,
        "ttft_s": ttft,
        "ttft_all_s": {kind: [m.ttft_s for m in results[kind]] for kind in KINDS},
        "kv_load_s": {k: statistics.median(m.kv_load_s for m in results[k]) for k in KINDS},
        "cached_tokens": {
            kind: [
                (m.num_cached_tokens, m.num_cached_tokens_host, m.num_cached_tokens_disk)
                for m in results[kind]
            ]
            for kind in KINDS
        },
        "head_cost_over_recompute": head_cost,
        "tier_stats": stats,
    }


def _describe(metrics) -> str:
    return (
        f"TTFT {metrics.ttft_s:.3f} s, cached {metrics.num_cached_tokens} (host "
        f"{metrics.num_cached_tokens_host}, disk {metrics.num_cached_tokens_disk})"
    )


def vars_of(stats) -> dict:
    return {name: getattr(stats, name) for name in stats.__slots__}


def format_tiers(result: dict) -> str:
    lines = [
        f"{result['model']}: head {result['head_tokens']} + tail {result['tail_tokens']} tokens, "
        f"median of {result['repeats']}",
        f"{'head from':<10}{'TTFT (s)':>10}{'load (s)':>10}{'cached (total, host, disk)':>30}",
    ]
    for kind in KINDS:
        cached = result["cached_tokens"][kind][-1]
        lines.append(
            f"{kind:<10}{result['ttft_s'][kind]:>10.3f}{result['kv_load_s'][kind]:>10.3f}"
            f"{cached!s:>30}"
        )
    for kind, share in result["head_cost_over_recompute"].items():
        lines.append(f"head from {kind}: {100 * share:.1f}% of recomputing it (target ≤ 20% disk)")
    return "\n".join(lines)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    add_arguments(
        parser,
        "model",
        "head_tokens",
        "tail_tokens",
        "repeats",
        "seed",
        "json",
        "json_out",
        head_tokens=1500,
        tail_tokens=500,
    )


def main(args: argparse.Namespace) -> int:
    meta = run_meta(args)
    result = run_tiers(
        args.model,
        head_tokens=args.head_tokens,
        tail_tokens=args.tail_tokens,
        repeats=args.repeats,
        seed=args.seed,
        progress=progress,
    )
    result = {**meta, **result}
    return emit(args, result, format_tiers(result))
