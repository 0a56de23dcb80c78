"""`python -m benchmarks steady-decode`, and what the town mode measures after each cached run:
decode alone, `concurrency` requests decoding together with no prompt chunk in their steps.

A workload run's "decode per token" counts the steps each request decoded in, and most of
those also carried another request's prompt chunk (four in flight over eight requests: a new
one starts as each ends). That is what a request of the town sees; it is not the decode step.
Here the workload's first `concurrency` prompts, already in the prefix cache from the run,
are asked again for `num_tokens` tokens each (no schema, EOS ignored): their prefill is one
cached block's worth, then every step decodes all of them and nothing else. Then the first
prompt alone, the same way: decode at one in flight.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass

from benchmarks.lib.workload import Workload, build_workload, chat_tokenizer_for
from inference.engine import EngineConfig, LLMEngine, SamplingParams


@dataclass(frozen=True, slots=True)
class SteadyDecode:
    concurrency: int
    s_per_token: float  # each request's, at `concurrency` in flight: the step's time
    single_s_per_token: float  # one request alone


def measure_steady_decode(
    engine: LLMEngine, workload: Workload, concurrency: int, num_tokens: int = 33
) -> SteadyDecode:
    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    prompts = workload.requests[:concurrency]
    together = engine.generate(prompts, params)
    alone = engine.generate(prompts[:1], params)
    return SteadyDecode(concurrency, _per_token(together), _per_token(alone))


def _per_token(outputs) -> float:
    decode = sum(o.metrics.decode_s for o in outputs)
    steps = sum(max(0, o.metrics.num_output_tokens - 1) for o in outputs)
    return decode / steps


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--weights", default="fp32")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64, help="tokens each request decodes")
    parser.add_argument("--ticks", type=int, choices=(1, 2), default=2)
    parser.add_argument("--disk-tier", action="store_true", help="a disk KV tier (a temp dir)")


def main(args: argparse.Namespace) -> int:
    """Decode alone on a fresh engine, the town workload's first prompts cached first (one
    token each), then asked for --tokens."""
    if args.concurrency < 1 or args.tokens < 2:
        raise ValueError("--concurrency must be ≥ 1 and --tokens ≥ 2")
    with tempfile.TemporaryDirectory() as directory:
        engine = LLMEngine(
            EngineConfig(
                model=args.model,
                weights=args.weights,
                kv_cache_dtype=args.kv_cache_dtype,
                kv_disk_cache_dir=directory if args.disk_tier else None,
            )
        )
        try:
            workload = build_workload(
                chat_tokenizer_for(engine.tokenizer), num_requests=8, ticks=args.ticks
            )
            prompts = workload.requests[: args.concurrency]
            engine.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0))
            steady = measure_steady_decode(engine, workload, args.concurrency, args.tokens + 1)
        finally:
            engine.shutdown()
    print(
        f"{args.model}, {engine.weights} weights, {engine.kv_cache_dtype} KV cache"
        f"{', disk tier' if args.disk_tier else ''}, load {os.getloadavg()[0]:.2f}: decode "
        f"alone {steady.s_per_token * 1e3:.1f} ms a token at {args.concurrency} in flight, "
        f"{steady.single_s_per_token * 1e3:.1f} ms at 1"
    )
    return 0
