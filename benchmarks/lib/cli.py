"""The arguments several modes share, each added by the modes that read it, and what every mode
records of its run: the command, the start, the machine.

A mode picks its arguments by name (`add_arguments(parser, "requests", "head_tokens", ...)`)
and may change a default there (`head_tokens=1500`); the help shows the mode's own default.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform

import torch

from benchmarks.lib.workload import DECISION_MAX_TOKENS, Workload
from inference.engine import EngineConfig, LLMEngine


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be ≥ 1")
    return value


def token_range(text: str) -> tuple[int, int]:
    """'1500-2500' → (1500, 2500)."""
    try:
        low, high = (int(part) for part in text.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must look like 1500-2500, got {text!r}") from None
    return low, high


ARGUMENTS: dict[str, tuple[str, dict]] = {
    "model": ("--model", dict(default="smollm2-135m-instruct")),
    "requests": ("--requests", dict(type=positive_int, default=8, help="requests per run")),
    "concurrency": (
        "--concurrency",
        dict(type=positive_int, default=4, help="requests in flight"),
    ),
    "head_tokens": (
        "--head-tokens",
        dict(type=int, default=1200, help="shared head size (default %(default)s)"),
    ),
    "tail_tokens": (
        "--tail-tokens",
        dict(type=int, default=100, help="each request's own tail (default %(default)s)"),
    ),
    "prompt_tokens": (
        "--prompt-tokens",
        dict(
            type=token_range,
            default="1500-2500",
            help="LOW-HIGH: each prompt's size in tokens (default %(default)s)",
        ),
    ),
    "max_tokens": (
        "--max-tokens",
        dict(
            type=positive_int,
            default=DECISION_MAX_TOKENS,
            help="output tokens at most; the default is a cap the decision schema never reaches "
            "(outputs end at ~50 tokens), so every output is complete JSON",
        ),
    ),
    "seed": ("--seed", dict(type=int, default=0, help="seed of the workload")),
    "repeats": ("--repeats", dict(type=int, default=3, help="repetitions")),
    "weights": (
        "--weights",
        dict(default="fp32", help="engine weight format (fp32 | int8 | int4 | auto)"),
    ),
    "kv_cache_dtype": (
        "--kv-cache-dtype",
        dict(default="auto", help="engine KV cache dtype (auto | float32 | bfloat16)"),
    ),
    "prefill_chunk_while_decoding": (
        "--prefill-chunk-while-decoding",
        dict(
            type=int,
            default=None,
            help="engine: the most prompt tokens a request computes in a step that has decodes",
        ),
    ),
    "max_num_batched_tokens": (
        "--max-num-batched-tokens",
        dict(type=int, default=None, help="engine token budget per step"),
    ),
    "json": ("--json", dict(action="store_true", help="print one JSON object")),
    "json_out": (
        "--json-out",
        dict(default=None, help="also write the JSON object to this file"),
    ),
}

# What `make_engine` reads: a mode that builds its engines with it adds these.
ENGINE_ARGUMENTS = (
    "model",
    "weights",
    "kv_cache_dtype",
    "prefill_chunk_while_decoding",
    "max_num_batched_tokens",
)


def add_arguments(parser: argparse.ArgumentParser, *names: str, **defaults) -> None:
    """The shared arguments `names`, with a mode's own `defaults` over theirs."""
    for name in names:
        flag, options = ARGUMENTS[name]
        parser.add_argument(flag, **options)
    parser.set_defaults(**defaults)


def make_engine(
    args: argparse.Namespace,
    enable_prefix_caching: bool,
    retention_interval: int | None = None,
    enable_jump_forward: bool = True,
    **overrides,
) -> LLMEngine:
    """A fresh engine from the ENGINE_ARGUMENTS, with `overrides` over them."""
    config = {
        "model": args.model,
        "enable_prefix_caching": enable_prefix_caching,
        "enable_jump_forward": enable_jump_forward,
        "retention_interval": retention_interval,
        "weights": args.weights,
        "kv_cache_dtype": args.kv_cache_dtype,
        "prefill_chunk_while_decoding": args.prefill_chunk_while_decoding,
        **overrides,
    }
    if args.max_num_batched_tokens is not None:
        config["max_num_batched_tokens"] = args.max_num_batched_tokens
    return LLMEngine(EngineConfig(**config))


def run_meta(args: argparse.Namespace) -> dict:
    """What every mode records first, before it loads anything: its command line, when it
    started, the load average then and the CPU."""
    return {
        "command": args.command,
        "started": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_at_start": os.getloadavg()[0],
        "cpu": cpu_model(),
    }


def town_meta(
    args: argparse.Namespace,
    start: dict,
    workload: Workload,
    *,
    ticks: int,
    weights: str,
    kv_cache_dtype: str,
) -> dict:
    """The town and retention-sweep record: the command, the machine, the workload."""
    return {
        "command": start["command"],
        "machine": {
            "nproc": os.cpu_count(),
            "cpu": start["cpu"],
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "date": start["started"],
            # The machine is shared: a load above the core count means the numbers are noisy.
            "load_avg_1m_at_start": round(start["load_at_start"], 2),
        },
        "workload": {
            "model": args.model,
            "seed": workload.seed,
            "num_requests": len(workload.requests),
            "concurrency": args.concurrency,
            "max_tokens": args.max_tokens,
            "ticks": ticks,
            "weights": weights,
            "kv_cache_dtype": kv_cache_dtype,
            "prefill_chunk_while_decoding": args.prefill_chunk_while_decoding,
            "head_tokens": workload.num_head_tokens,
            "shared_prefix_tokens": workload.num_shared_prefix_tokens,
            "prompt_tokens": workload.prompt_token_counts,
            "num_targets": len(workload.schema["properties"]["target"]["enum"]),
        },
    }


def town_header(meta: dict) -> str:
    m, w = meta["machine"], meta["workload"]
    return (
        f"{m['date']} · {m['cpu']} · {m['nproc']} CPUs (load {m['load_avg_1m_at_start']}) · "
        f"torch {m['torch']} ({m['torch_threads']} threads)\n"
        f"{w['model']}: {w['num_requests']} requests, {w['concurrency']} in flight, "
        f"head {w['head_tokens']} tokens (shared prefix {w['shared_prefix_tokens']}), "
        f"prompts {min(w['prompt_tokens'])}–{max(w['prompt_tokens'])} tokens, "
        f"max_tokens {w['max_tokens']}, seed {w['seed']}, ticks {w['ticks']}, "
        f"{w['weights']} weights, KV cache {w['kv_cache_dtype']}, prefill chunk while decoding "
        f"{w['prefill_chunk_while_decoding'] or 'uncapped'}\n"
    )


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
