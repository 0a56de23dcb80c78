"""`python -m benchmarks town`: the town-shaped benchmark, engine vs transformers.

Runs, in one process, on the same workload: the engine with prefix caching on (the main
number), with it off, without the JSON schema, with prompt-lookup speculative decoding (`ngram`,
`ngram_no_schema`) or DeepSeek-V4's MTP drafts (`mtp`, asked for by name), then transformers'
`generate` and, when llama-cpp-python is installed (the `llamacpp` extra), llama.cpp on the same
GGUF file, one request at a time. Each engine run gets a fresh engine. Prints a table and the
ratios against the issues' targets (`--json`: one JSON object). Progress goes to stderr.
`--weights` picks the engine's weight format (fp32 | int8 | int4 | auto), `--kv-cache-dtype` its
KV cache's (auto | float32 | bfloat16), `--ticks 2` the town's two-tick pattern (each resident's
own head repeating on tick 2). After each `cached*` run its engine also decodes alone, with no
prompt chunk beside it (steady_decode): the decode step itself, at the concurrency and at one.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

import torch

from benchmarks.lib import baseline_llamacpp
from benchmarks.lib.baseline_transformers import run_transformers
from benchmarks.lib.cli import (
    add_arguments,
    make_engine,
    positive_int,
    run_meta,
    town_header,
    town_meta,
)
from benchmarks.lib.engine_run import ENGINE_RUNS, EngineRunSpec, run_engine
from benchmarks.lib.floor import (
    Floor,
    floor_json,
    format_decode_floor,
    format_floor,
    measure_floor,
)
from benchmarks.lib.output import progress
from benchmarks.lib.own_thread import in_own_thread
from benchmarks.lib.report import format_table, summarize, to_json
from benchmarks.lib.results import RunResult
from benchmarks.lib.workload import Workload, build_workload
from benchmarks.steady_decode import measure_steady_decode
from inference.engine import LLMEngine
from inference.engine.models import load_tokenizer

RUN_NAMES = [*ENGINE_RUNS, "transformers", baseline_llamacpp.NAME]


def _run_names(text: str) -> list[str]:
    runs = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(runs) - set(RUN_NAMES))
    if unknown or not runs:
        raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {RUN_NAMES}")
    return runs


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    add_arguments(
        parser,
        "model",
        "requests",
        "concurrency",
        "head_tokens",
        "prompt_tokens",
        "max_tokens",
        "seed",
        "prefill_chunk_while_decoding",
        "max_num_batched_tokens",
        "json",
        "json_out",
    )
    parser.add_argument(
        "--ticks",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: --requests / 2 residents asked twice, each one's own head repeating on tick 2",
    )
    parser.add_argument(
        "--weights",
        default="fp32",
        help="engine weight format (fp32 | int8 | int4 | auto); a comma-separated list adds a "
        "cached_<format> run for each format after the first",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="engine KV cache dtype (auto | float32 | bfloat16); a comma-separated list adds a "
        "cached_kv_<dtype> run for each dtype after the first",
    )
    parser.add_argument(
        "--runs",
        type=_run_names,
        default=",".join(name for name in RUN_NAMES if name != "mtp"),  # mtp: DeepSeek-V4 only
        help=f"comma-separated subset of {RUN_NAMES}",
    )
    parser.add_argument("--skip-baseline", action="store_true", help="no transformers run")
    parser.add_argument(
        "--baseline-requests",
        type=positive_int,
        default=4,
        help="requests the (slow) baseline runs",
    )
    parser.add_argument(
        "--num-speculative-tokens",
        type=positive_int,
        default=4,
        help="draft tokens per step of the speculative runs (ngram, ngram_no_schema)",
    )


def main(args: argparse.Namespace) -> int:
    start = run_meta(args)
    if args.requests % args.ticks:
        raise ValueError(f"--requests must be a multiple of --ticks ({args.ticks})")
    if args.skip_baseline:
        args.runs = [name for name in args.runs if name != "transformers"]
    args.baseline_requests = min(args.baseline_requests, args.requests)
    args.weights, *args.more_weights = [w.strip() for w in args.weights.split(",")]
    args.kv_cache_dtype, *args.more_kv_cache_dtypes = [
        d.strip() for d in args.kv_cache_dtype.split(",")
    ]
    runs, workload, floor = _run_all(args)
    summaries = {run.name: summarize(run) for run in runs}
    meta = town_meta(
        args,
        start,
        workload,
        ticks=args.ticks,
        weights=",".join([args.weights, *args.more_weights]),
        kv_cache_dtype=",".join([args.kv_cache_dtype, *args.more_kv_cache_dtypes]),
    )
    floor_lines = format_floor(floor, {n: s.requests_per_min for n, s in summaries.items()})
    if floor is not None and "cached" in summaries:
        floor_lines += format_decode_floor(
            floor, summaries, args.concurrency, args.weights, args.kv_cache_dtype
        )
    if floor is not None:
        meta["compute_floor"] = floor_json(floor)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            f.write(to_json(meta, runs, summaries, args.ticks, args.concurrency) + "\n")
    if args.json:
        print(to_json(meta, runs, summaries, args.ticks, args.concurrency))
    else:
        print(town_header(meta))
        print(format_table(runs, summaries, args.ticks, args.concurrency))
        if "cached" in summaries:
            print("\n".join(floor_lines))
    return 0


def _run_all(args: argparse.Namespace) -> tuple[list[RunResult], Workload, Floor | None]:
    runs: list[RunResult] = []
    workload = None
    floor = None
    for name in [n for n in ENGINE_RUNS if n in args.runs]:
        spec = ENGINE_RUNS[name]
        engine_options = dict(
            enable_jump_forward=spec.enable_jump_forward,
            enable_decode_windows=spec.enable_decode_windows,
            speculative_method=spec.speculative_method,
            num_speculative_tokens=args.num_speculative_tokens,
        )

        def floor_of(engine: LLMEngine, run: RunResult, workload: Workload) -> None:
            nonlocal floor
            if run.name == "cached":
                progress("cached: measuring the workload's compute floor on this machine")
                floor = in_own_thread(
                    measure_floor,
                    engine.runner.model,
                    workload.prompt_token_counts,
                    workload.prompt_reused_tokens,
                    workload.num_shared_prefix_tokens,
                    run,
                    args.concurrency,
                    getattr(torch, engine.kv_cache_dtype),
                )

        workload = _measure(args, spec, engine_options, runs, workload, then=floor_of)
    # The main run again with other weights (--weights a,b) or KV cache dtypes.
    variants = [(f"cached_{w}", f"{w} weights", dict(weights=w)) for w in args.more_weights]
    variants += [
        (f"cached_kv_{d}", f"a {d} KV cache", dict(kv_cache_dtype=d))
        for d in args.more_kv_cache_dtypes
    ]
    for name, what, overrides in variants:
        cached = ENGINE_RUNS["cached"]
        spec = dataclasses.replace(cached, name=name, description=f"{cached.description}, {what}")
        workload = _measure(args, spec, overrides, runs, workload)
    _note_speculative_exactness(runs)
    tokenizer = load_tokenizer(args.model)
    if workload is None:  # only the baselines: the workload is still measured in engine tokens
        workload = _workload_of(tokenizer, args)
    if "transformers" in args.runs:
        progress(f"transformers: loading, then {args.baseline_requests} requests one at a time")
        runs.append(
            in_own_thread(
                run_transformers,
                workload,
                model=args.model,
                num_requests=args.baseline_requests,
                output_token_counts=_output_token_counts(runs, args),
            )
        )
        progress(f"transformers: done in {runs[-1].wall_s:.1f} s")
    if baseline_llamacpp.NAME in args.runs:
        if baseline_llamacpp.is_available():
            progress(f"llamacpp: loading, then {args.requests} requests one at a time")
            runs.append(
                baseline_llamacpp.run_llamacpp(
                    workload,
                    model=args.model,
                    tokenizer=tokenizer,
                    output_token_counts=_output_token_counts(runs, args),
                )
            )
            progress(f"llamacpp: done in {runs[-1].wall_s:.1f} s")
        else:
            progress("llamacpp: llama-cpp-python not installed (the llamacpp extra), skipped")
    return runs, workload, floor


def _measure(
    args: argparse.Namespace,
    spec: EngineRunSpec,
    engine_options: dict,
    runs: list[RunResult],
    workload: Workload | None,
    then: Callable[[LLMEngine, RunResult, Workload], None] | None = None,
) -> Workload:
    """One engine run on a fresh engine, appended to `runs`; `then` runs on the engine once
    it has shut down (its model still loaded, its thread ended: a thread that timed torch
    work beside the engine's would share the 2 CPUs with a second OpenMP team, and time each
    small op ~1.4× slower). Returns the workload (built by the first engine)."""
    progress(f"{spec.name}: loading a fresh engine")
    engine = make_engine(args, spec.enable_prefix_caching, **engine_options)
    try:
        workload = workload or _workload(engine, args)
        progress(f"{spec.name}: {spec.description}, {args.requests} requests")
        run = run_engine(
            engine,
            spec,
            workload,
            concurrency=args.concurrency,
            max_tokens=args.max_tokens,
            output_token_counts=_output_token_counts(runs, args),
        )
        if spec.name.startswith("cached"):
            progress(f"{spec.name}: decoding alone, {args.concurrency} in flight, then 1")
            steady = measure_steady_decode(engine, workload, args.concurrency)
            run = dataclasses.replace(
                run,
                steady_decode_s_per_token=steady.s_per_token,
                steady_decode_single_s_per_token=steady.single_s_per_token,
            )
        runs.append(run)
    finally:
        engine.shutdown()
    if then is not None:
        then(engine, run, workload)
    progress(f"{spec.name}: done in {runs[-1].wall_s:.1f} s")
    return workload


def _note_speculative_exactness(runs: list[RunResult]) -> None:
    """Speculative decoding is greedy-exact: say how many outputs match the run without it."""
    by_name = {run.name: run for run in runs}
    for spec, plain in (("ngram", "cached"), ("ngram_no_schema", "no_schema"), ("mtp", "cached")):
        if spec in by_name and plain in by_name:
            pairs = zip(by_name[spec].records, by_name[plain].records, strict=True)
            same = sum(a.text == b.text for a, b in pairs)
            total = len(by_name[spec].records)
            by_name[spec].notes.append(f"outputs identical to {plain}'s: {same}/{total}")


def _output_token_counts(runs: list[RunResult], args: argparse.Namespace) -> list[int]:
    """What the main (cached) run made per request, so that the runs compared with it make the
    same; max_tokens each when it was not run."""
    cached = next((run for run in runs if run.name == "cached"), None)
    if cached is None:
        return [args.max_tokens] * args.requests
    return [record.num_output_tokens for record in cached.records]


def _workload(engine: LLMEngine, args: argparse.Namespace) -> Workload:
    return _workload_of(engine.tokenizer, args)


def _workload_of(tokenizer, args: argparse.Namespace) -> Workload:
    return build_workload(
        tokenizer,
        num_requests=args.requests,
        head_tokens=args.head_tokens,
        prompt_token_range=args.prompt_tokens,
        seed=args.seed,
        ticks=args.ticks,
    )
