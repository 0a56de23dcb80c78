"""The GPU benchmark, part 2: the engine on CUDA in bf16 — the town benchmark (this package's
workload and runs), decode throughput at several batch sizes, and the same decode measure on
this machine's CPU (the torch path, fp32) as the baseline of the ×10 target."""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field

from benchmarks.lib.engine_run import ENGINE_RUNS, run_engine
from benchmarks.lib.report import summarize
from benchmarks.lib.workload import DECISION_MAX_TOKENS, Workload, build_workload
from inference.engine import EngineConfig, LLMEngine, SamplingParams

DECODE_CONCURRENCY = (4, 16, 64)


@dataclass(slots=True)
class EngineResult:
    model: str
    requests_per_s: dict[str, float] = field(default_factory=dict)  # by run: cached / uncached
    mean_prefill_s: dict[str, float] = field(default_factory=dict)
    cache_hit_rate: float | None = None
    decode_tokens_per_s: dict[int, float] = field(default_factory=dict)  # by concurrency
    decode_16_without_graphs: float | None = None
    cpu_decode_16: float | None = None
    notes: list[str] = field(default_factory=list)


def engine_config(model: str, device: str, **overrides) -> EngineConfig:
    on_cuda = device.startswith("cuda")
    fields = dict(
        model=model, device=device, max_num_seqs=64,
        max_num_batched_tokens=8192 if on_cuda else 1024,
        kv_cache_memory_bytes=(16 if on_cuda else 4) << 30,
    )  # fmt: skip
    fields.update(overrides)
    return EngineConfig(**fields)


def town_workload(engine: LLMEngine, num_requests: int) -> Workload:
    return build_workload(engine.tokenizer, num_requests=num_requests, seed=0)


def town_run(engine: LLMEngine, run: str, workload: Workload, num_requests: int, result):
    """One of the town benchmark's runs ("cached" / "uncached"), 16 requests in flight."""
    subset = dataclasses.replace(
        workload,
        requests=workload.requests[:num_requests],
        prompt_token_counts=workload.prompt_token_counts[:num_requests],
    )
    summary = summarize(
        run_engine(engine, ENGINE_RUNS[run], subset, concurrency=16, max_tokens=DECISION_MAX_TOKENS)
    )
    result.requests_per_s[run] = summary.requests_per_min / 60
    result.mean_prefill_s[run] = summary.mean_prefill_s
    if run == "cached":
        result.cache_hit_rate = summary.token_cache_hit_rate
    _progress(f"{result.model} {run}: {summary.requests_per_min / 60:.2f} requests/s")


def decode_tokens_per_s(
    engine: LLMEngine, workload: Workload, concurrency: int, num_tokens: int
) -> float:
    """Decode alone, `concurrency` sequences of town-prompt context in one batch.

    The prompts are prefilled once (filling the prefix cache); then the same batch is timed
    making 1 token and making 1 + num_tokens: the difference is num_tokens decode steps."""
    prompts = workload.requests[:concurrency]
    if len(prompts) < concurrency:
        raise ValueError(f"the workload has {len(prompts)} prompts, fewer than {concurrency}")
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    engine.generate(prompts, one)
    start = time.perf_counter()
    engine.generate(prompts, one)
    first = time.perf_counter() - start
    start = time.perf_counter()
    engine.generate(prompts, dataclasses.replace(one, max_tokens=1 + num_tokens))
    both = time.perf_counter() - start
    return concurrency * num_tokens / max(both - first, 1e-9)


def run_engine_benchmarks(model: str, quick: bool, deadline: float, with_cpu: bool):
    result = EngineResult(model)
    num_requests, num_tokens = (16, 16) if quick else (64, 48)
    engine = LLMEngine(engine_config(model, "cuda"))
    try:
        workload = town_workload(engine, 64)
        town_run(engine, "cached", workload, num_requests, result)
        for concurrency in DECODE_CONCURRENCY:
            result.decode_tokens_per_s[concurrency] = decode_tokens_per_s(
                engine, workload, concurrency, num_tokens
            )
            _progress(f"{model} decode at {concurrency}: "
                      f"{result.decode_tokens_per_s[concurrency]:.0f} tokens/s")  # fmt: skip
    finally:
        engine.shutdown()
    runs = [("uncached", dict(enable_prefix_caching=False))]
    if not quick:
        runs.append(("no graphs", dict(enable_cuda_graphs=False)))
    for name, overrides in runs:
        if time.monotonic() > deadline:
            result.notes.append(f"{model}: skipped the {name} run (time budget)")
            continue
        engine = LLMEngine(engine_config(model, "cuda", **overrides))
        try:
            if name == "uncached":
                town_run(engine, "uncached", workload, num_requests, result)
            else:
                result.decode_16_without_graphs = decode_tokens_per_s(
                    engine, workload, 16, num_tokens
                )
        finally:
            engine.shutdown()
    if with_cpu:
        if time.monotonic() > deadline:
            result.notes.append(f"{model}: skipped the CPU baseline (time budget)")
        else:
            _progress(f"{model}: CPU baseline (torch path, fp32), 16 in flight")
            engine = LLMEngine(engine_config(model, "cpu", max_num_seqs=16))
            try:
                result.cpu_decode_16 = decode_tokens_per_s(engine, workload, 16, num_tokens // 4)
            finally:
                engine.shutdown()
    return result


def _progress(message: str) -> None:
    print(f"[gpu bench] {message}", file=sys.stderr, flush=True)
