"""One engine configuration over the workload: `concurrency` threads, each calling `generate`
on its next request, the way a Celery worker's threads share one in-process engine."""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from benchmarks.lib.results import RequestRecord, RunResult
from benchmarks.lib.workload import Workload
from inference.engine import LLMEngine, RequestOutput, SamplingParams


@dataclass(frozen=True, slots=True)
class EngineRunSpec:
    name: str
    description: str
    enable_prefix_caching: bool
    use_schema: bool
    # Without a schema the model stops wherever it likes. To compare decode per token with the
    # schema-on run, this run ignores EOS and makes, per request, as many tokens as that run did:
    # the same batch shapes, the same overlap with other requests' prefill chunks.
    match_output_lengths: bool = False
    # Jump-forward: the tokens the schema forces are appended without a model step of their own.
    enable_jump_forward: bool = True
    # Decode windows: the decoding sequences' contexts read together (see decode_windows).
    enable_decode_windows: bool = True
    # Speculative decoding (spec_decode): None, or the drafter ("ngram": prompt lookup; "mtp":
    # the model's multi-token-prediction layer).
    speculative_method: str | None = None


ENGINE_RUNS: dict[str, EngineRunSpec] = {
    spec.name: spec
    for spec in [
        EngineRunSpec("cached", "engine, prefix caching on, JSON schema on", True, True),
        EngineRunSpec("uncached", "engine, prefix caching off, JSON schema on", False, True),
        EngineRunSpec("no_schema", "engine, prefix caching on, no schema, same output lengths",
                      True, False, match_output_lengths=True),
        EngineRunSpec("no_jump", "engine, prefix caching on, JSON schema on, no jump-forward",
                      True, True, enable_jump_forward=False),
        EngineRunSpec("no_windows", "engine, prefix caching on, JSON schema on, decode span by "
                      "span", True, True, enable_decode_windows=False),
        EngineRunSpec("ngram", "engine, prefix caching on, JSON schema on, prompt-lookup "
                      "speculative decoding", True, True, speculative_method="ngram"),
        EngineRunSpec("ngram_no_schema", "engine, prefix caching on, no schema, same output "
                      "lengths, prompt-lookup speculative decoding", True, False,
                      match_output_lengths=True, speculative_method="ngram"),
        EngineRunSpec("mtp", "engine, prefix caching on, JSON schema on, the model's MTP layer "
                      "drafts (DeepSeek-V4)", True, True, speculative_method="mtp"),
    ]
}  # fmt: skip


def run_engine(
    engine: LLMEngine,
    spec: EngineRunSpec,
    workload: Workload,
    *,
    concurrency: int,
    max_tokens: int,
    output_token_counts: list[int] | None = None,
) -> RunResult:
    """Run every request of `workload` on `engine` (fresh: its prefix cache must be empty).

    `output_token_counts` (one per request) is what a `match_output_lengths` run makes."""
    schema = workload.schema if spec.use_schema else None
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, json_schema=schema)
    per_request = [params] * len(workload.requests)
    if spec.match_output_lengths:
        if output_token_counts is None or len(output_token_counts) != len(workload.requests):
            raise ValueError(f"run {spec.name!r} needs one output token count per request")
        per_request = [
            dataclasses.replace(params, max_tokens=n, ignore_eos=True) for n in output_token_counts
        ]
    # A one-token prompt fills no KV block, so this warms the model and compiles the grammar
    # without putting anything the workload could reuse into the prefix cache.
    engine.generate("Hi", dataclasses.replace(params, max_tokens=2))
    before = engine.stats()
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="bench-worker") as pool:
        outputs = list(pool.map(lambda messages, p: engine.generate([messages], p)[0],
                                workload.requests, per_request))  # fmt: skip
    wall_s = time.perf_counter() - start
    after = engine.stats()
    return RunResult(
        name=spec.name,
        description=spec.description,
        records=[_record(output) for output in outputs],
        wall_s=wall_s,
        schema=schema,
        engine_stats={
            "prefix_cache_queries": after.prefix_cache_queries - before.prefix_cache_queries,
            "prefix_cache_hits": after.prefix_cache_hits - before.prefix_cache_hits,
            "num_preemptions": after.num_preemptions - before.num_preemptions,
            "num_steps": after.num_steps - before.num_steps,
            "num_forced_tokens": after.num_forced_tokens - before.num_forced_tokens,
            "num_spec_verifications": after.num_spec_verifications - before.num_spec_verifications,
            "num_draft_tokens": after.num_draft_tokens - before.num_draft_tokens,
            "num_accepted_tokens": after.num_accepted_tokens - before.num_accepted_tokens,
            # What the run ran with, not a delta.
            "weights": after.weights,
            "kv_cache_dtype": after.kv_cache_dtype,
        },
    )


def _record(output: RequestOutput) -> RequestRecord:
    m = output.metrics
    return RequestRecord(
        num_prompt_tokens=m.num_prompt_tokens,
        num_cached_tokens=m.num_cached_tokens,
        num_output_tokens=m.num_output_tokens,
        queue_s=m.queue_s,
        prefill_s=m.prefill_s,
        decode_s=m.decode_s,
        e2e_s=m.e2e_s,
        text=output.text,
        finish_reason=output.finish_reason,
    )
