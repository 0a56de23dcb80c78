"""How far the quantized weight formats (and a bfloat16 KV cache) stray from fp32 on the
town's prompts, and how fast.

`python -m benchmarks weights-agreement` runs the town-shaped workload (JSON
schema on, greedy) once per format on a fresh engine and compares every format with fp32. A
format is a weight format, optionally with a KV cache dtype after a slash: `int4/bfloat16`
runs int4 weights over a bfloat16 KV cache (`--formats fp32,int4,int4/bfloat16`).

- decisions: the share of prompts whose output is token for token the fp32 one, the share
  whose decision (action and target) is the same, and the mean tokens before the first
  divergence;
- logits: teacher-forced on the fp32 outputs (prompt + output in one prefill), the max and
  mean absolute difference of the next-token logits over every output position, and the
  share of positions whose argmax agrees (one prefill reads its own keys in float32, not the
  cache: a KV dtype shows in the decisions, not here);
- the JSON validity rate, requests/min and decode ms per token at the given concurrency.

Its table chose what weights="auto" resolves to (models.AUTO_CPU_WEIGHTS): the fastest format
whose decisions agree with fp32 on ≥ 95% of the prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from benchmarks.lib.workload import DECISION_MAX_TOKENS, build_workload, is_valid_decision
from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.attention.attention_backend import GroupSpans, ScheduledSpan
from inference.engine.models import load_tokenizer


@dataclass(frozen=True, slots=True)
class FormatRun:
    weights: str  # "int4", or "int4/bfloat16" with a KV cache dtype
    token_ids: list[list[int]]
    texts: list[str]
    logits: list[torch.Tensor]  # per prompt: (num_output_tokens, vocab), teacher-forced
    wall_s: float
    decode_s_per_token: float  # summed decode time over tokens after the first, per request


def run_format(model: str, fmt: str, workload, concurrency: int, forced=None) -> FormatRun:
    """Generate every prompt greedily on a fresh engine; then the teacher-forced logits of
    `forced` (per prompt, the output token ids to force; default: its own). `fmt`: weights,
    or weights/KV cache dtype."""
    weights, _, kv_cache_dtype = fmt.partition("/")
    engine = LLMEngine(
        EngineConfig(model=model, weights=weights, kv_cache_dtype=kv_cache_dtype or "auto")
    )
    try:
        params = SamplingParams(
            max_tokens=DECISION_MAX_TOKENS, temperature=0.0, json_schema=workload.schema
        )
        engine.generate("Hi", SamplingParams(max_tokens=2))  # warm-up, nothing reusable
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            outputs = list(pool.map(lambda m: engine.generate([m], params)[0], workload.requests))
        wall_s = time.perf_counter() - start
        token_ids = [list(o.token_ids) for o in outputs]
        decode = sum(o.metrics.decode_s for o in outputs)
        steps = sum(max(0, o.metrics.num_output_tokens - 1) for o in outputs)
        prompts = [list(o.prompt_token_ids) for o in outputs]
        forced = forced or token_ids
        logits = [forced_logits(engine, p, f) for p, f in zip(prompts, forced, strict=True)]
        return FormatRun(
            weights=engine.weights + (f"/{kv_cache_dtype}" if kv_cache_dtype else ""),
            token_ids=token_ids,
            texts=[o.text for o in outputs],
            logits=logits,
            wall_s=wall_s,
            decode_s_per_token=decode / max(steps, 1),
        )
    finally:
        engine.shutdown()


@torch.inference_mode()
def forced_logits(engine: LLMEngine, prompt: list[int], output: list[int]) -> torch.Tensor:
    """Next-token logits at each output position, prompt + output run as one prefill in the
    engine's KV blocks 0.. (call only once its requests are done: it overwrites them)."""
    runner = engine.runner
    tokens = prompt + output[:-1]
    num_tokens = len(tokens)
    block_ids = list(range(-(-num_tokens // runner.block_size)))
    span = ScheduledSpan(0, num_tokens, 0, block_ids)
    full = GroupSpans(list(range(num_tokens)), [span])
    sliding = GroupSpans(list(range(num_tokens)), [span]) if runner.has_sliding else None
    rows = torch.arange(len(prompt) - 1, num_tokens)
    return runner.model(
        torch.tensor(tokens),
        torch.arange(num_tokens),
        runner.kv_caches,
        runner.metadata_builder.build(full, sliding),
        rows,
    ).float()


def _decision(text: str) -> tuple[str, str] | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return (value.get("action"), value.get("target")) if isinstance(value, dict) else None


def compare(reference: FormatRun, other: FormatRun, schema) -> dict:
    n = len(reference.token_ids)
    first_divergence = []
    for ref, out in zip(reference.token_ids, other.token_ids, strict=True):
        same = next(
            (i for i, (a, b) in enumerate(zip(ref, out, strict=False)) if a != b),
            min(len(ref), len(out)),
        )
        first_divergence.append(same)
    diffs = [(a - b).abs() for a, b in zip(reference.logits, other.logits, strict=True)]
    argmax_same = sum(
        int((a.argmax(-1) == b.argmax(-1)).sum())
        for a, b in zip(reference.logits, other.logits, strict=True)
    )
    positions = sum(d.shape[0] for d in diffs)
    return {
        "weights": other.weights,
        "identical_outputs": sum(
            a == b for a, b in zip(reference.token_ids, other.token_ids, strict=True)
        )
        / n,
        "identical_decisions": sum(
            _decision(a) == _decision(b) for a, b in zip(reference.texts, other.texts, strict=True)
        )
        / n,
        "mean_tokens_to_divergence": sum(first_divergence) / n,
        "max_logit_diff": max(float(d.max()) for d in diffs),
        "mean_logit_diff": sum(float(d.sum()) for d in diffs) / sum(d.numel() for d in diffs),
        "forced_argmax_agreement": argmax_same / positions,
        "json_valid": sum(is_valid_decision(t, schema) for t in other.texts) / n,
        "requests_per_min": n * 60 / other.wall_s,
        "decode_ms_per_token": other.decode_s_per_token * 1e3,
    }


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--formats", default="fp32,int8,int4")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json-out", default=None)


def main(args: argparse.Namespace) -> int:
    formats = [f.strip() for f in args.formats.split(",")]
    if formats[0] != "fp32":
        raise ValueError("--formats must start with fp32 (the reference)")
    load = os.getloadavg()[0]
    tokenizer = load_tokenizer(args.model)
    workload = build_workload(tokenizer, num_requests=args.requests, seed=args.seed)
    reference = run_format(args.model, "fp32", workload, args.concurrency)
    rows = [compare(reference, reference, workload.schema)]
    for fmt in formats[1:]:
        run = run_format(args.model, fmt, workload, args.concurrency, forced=reference.token_ids)
        rows.append(compare(reference, run, workload.schema))
    header = (
        f"{args.model}: {args.requests} town prompts (seed {args.seed}), {args.concurrency} in "
        f"flight, greedy, JSON schema on; load {load:.2f} at start, {os.getloadavg()[0]:.2f} at end"
    )
    print(header)
    for row in rows:
        print(
            f"{row['weights']:>13}: decisions same {row['identical_decisions']:.0%}, outputs same "
            f"{row['identical_outputs']:.0%}, tokens to divergence "
            f"{row['mean_tokens_to_divergence']:.1f}, logit diff max {row['max_logit_diff']:.3f} "
            f"mean {row['mean_logit_diff']:.4f}, forced argmax same "
            f"{row['forced_argmax_agreement']:.1%}, JSON valid {row['json_valid']:.0%}, "
            f"{row['requests_per_min']:.1f} req/min, decode {row['decode_ms_per_token']:.0f} "
            "ms/token"
        )
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump({"header": header, "rows": rows}, f, indent=2)
    return 0
