"""`python -m inference.engine.bench`: the town-shaped benchmark, engine vs transformers.

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

With `--retention-interval 4096,2048,1024,dense` it runs a retention sweep instead (see
retention_sweep): prompts sharing exactly `--head-tokens` tokens, one fresh engine per policy
and one with prefix caching off, and prints reuse, lost tokens by reason, prefill time and
checkpoint memory per policy. The sweep models vLLM's rounding (no partial-block copy, no
junctions, no shared prefill); `--exact-reuse` turns those on and declares a cache breakpoint
where the head ends, so the whole head is reused at every interval.

With `--fanout` it runs N requests sharing an uncached head at once, with one prefill per
shared head on and off (see fanout).

With `--tiers` it times the first token of a prompt whose head is cold, on disk, in host
memory or in the device pool (see tiers; --head-tokens, --tail-tokens, --repeats). With
`--restart` it runs the town's restart story: tick 2 after a worker restart, with the disk tier
and without, beside an engine that never stopped (see restart; --requests residents). With
`--priority` it times a short /v1-like request's first token idle, then with `--concurrency`
town requests in flight, in their class and ahead of it (see priority; --repeats).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import sys
from collections.abc import Callable

import torch

from inference.engine import EngineConfig, LLMEngine
from inference.engine.bench import baseline_llamacpp
from inference.engine.bench.baseline_transformers import run_transformers
from inference.engine.bench.engine_run import ENGINE_RUNS, EngineRunSpec, run_engine
from inference.engine.bench.fanout import fanout_main
from inference.engine.bench.floor import Floor, format_floor, measure_floor
from inference.engine.bench.output import emit, progress
from inference.engine.bench.own_thread import in_own_thread
from inference.engine.bench.priority import priority_main
from inference.engine.bench.report import format_table, summarize, to_json
from inference.engine.bench.restart import restart_main
from inference.engine.bench.results import RunResult
from inference.engine.bench.retention_sweep import (
    format_sweep,
    parse_intervals,
    run_sweep,
    sweep_json,
)
from inference.engine.bench.steady_decode import measure_steady_decode
from inference.engine.bench.tiers import tiers_main
from inference.engine.bench.workload import (
    DECISION_MAX_TOKENS,
    Workload,
    build_workload,
    chat_tokenizer_for,
)
from inference.engine.models import load_tokenizer

RUN_NAMES = [*ENGINE_RUNS, "transformers", baseline_llamacpp.NAME]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m inference.engine.bench", description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=8, help="requests per run")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument(
        "--head-tokens", type=int, default=None, help="shared head size (1200; --tiers: 1500)"
    )
    parser.add_argument(
        "--prompt-tokens",
        default=None,
        help="LOW-HIGH: each prompt's size in tokens (default 1500-2500; in a retention sweep, "
        "a few hundred tokens past the head)",
    )
    parser.add_argument(
        "--retention-interval",
        default=None,
        help="comma-separated retention policies to compare, each a number of tokens (a "
        "multiple of the block size), 'dense' or 'prompt-end', e.g. 4096,2048,1024,dense; "
        "prompts then share exactly --head-tokens tokens",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=DECISION_MAX_TOKENS,
        help="output tokens at most; the default is a cap the decision schema never reaches "
        "(outputs end at ~50 tokens), so every output is complete JSON",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the workload")
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
        "--prefill-chunk-while-decoding",
        type=int,
        default=None,
        help="engine: the most prompt tokens a request computes in a step that has decodes",
    )
    parser.add_argument(
        "--runs",
        default=",".join(name for name in RUN_NAMES if name != "mtp"),  # mtp: DeepSeek-V4 only
        help=f"comma-separated subset of {RUN_NAMES}",
    )
    parser.add_argument("--skip-baseline", action="store_true", help="no transformers run")
    parser.add_argument(
        "--baseline-requests", type=int, default=4, help="requests the (slow) baseline runs"
    )
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="engine token budget per step"
    )
    parser.add_argument(
        "--exact-reuse",
        action="store_true",
        help="retention sweep: breakpoint at the head's end, partial-block copy and junctions on",
    )
    parser.add_argument(
        "--bounded-replay",
        action="store_true",
        help="retention sweep: DeepSeek's bounded replay on (DeepSeek-V4; approximate), with "
        "its agreement with the prefix-caching-off run",
    )
    parser.add_argument(
        "--fanout",
        action="store_true",
        help="--requests prompts sharing an uncached --head-tokens head, all at once: one "
        "prefill per shared head on vs off (tails: --tail-tokens)",
    )
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=4,
        help="draft tokens per step of the speculative runs (ngram, ngram_no_schema)",
    )
    parser.add_argument(
        "--tail-tokens", type=int, default=None, help="--fanout (default 100), --tiers (500)"
    )
    parser.add_argument(
        "--tiers",
        action="store_true",
        help="TTFT with the --head-tokens head cold / on disk / in host memory / in the device "
        "pool (default head 1500, tail 500)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="--tiers: repetitions")
    parser.add_argument(
        "--restart",
        action="store_true",
        help="tick 2's hit rate and median e2e after a worker restart, disk tier on and off, "
        "beside an engine that never stopped (--requests residents)",
    )
    parser.add_argument(
        "--priority",
        action="store_true",
        help="a short request's TTFT idle, then with --concurrency town requests in flight, "
        "in their class and ahead of it (--repeats)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--json-out", default=None, help="also write the JSON object to this file")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.runs = [name.strip() for name in args.runs.split(",") if name.strip()]
    unknown = sorted(set(args.runs) - set(RUN_NAMES))
    if unknown or not args.runs:
        parser.error(f"--runs: unknown {unknown}; choose from {RUN_NAMES}")
    if args.skip_baseline:
        args.runs = [name for name in args.runs if name != "transformers"]
    args.intervals = None
    if args.retention_interval is not None:
        try:
            args.intervals = parse_intervals(args.retention_interval)
        except ValueError as exc:
            parser.error(str(exc))
    if args.tail_tokens is None:
        args.tail_tokens = 500 if args.tiers else 100
    if args.head_tokens is None:
        args.head_tokens = 1500 if args.tiers else 1200
    if args.prompt_tokens is None:
        # A sweep's head must fit in the shared system message, which is ≥ 90% of its target.
        low = _sweep_system_tokens(args.head_tokens) + 150
        args.prompt_tokens = f"{low}-{low + 300}" if args.intervals else "1500-2500"
    try:
        low, high = (int(part) for part in args.prompt_tokens.split("-"))
    except ValueError:
        parser.error(f"--prompt-tokens must look like 1500-2500, got {args.prompt_tokens!r}")
    args.prompt_token_range = (low, high)
    for flag in (
        "requests",
        "concurrency",
        "max_tokens",
        "baseline_requests",
        "num_speculative_tokens",
    ):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be ≥ 1")
    args.weights, *args.more_weights = [w.strip() for w in args.weights.split(",")]
    args.kv_cache_dtype, *args.more_kv_cache_dtypes = [
        d.strip() for d in args.kv_cache_dtype.split(",")
    ]
    if args.requests % args.ticks:
        parser.error(f"--requests must be a multiple of --ticks ({args.ticks})")
    args.baseline_requests = min(args.baseline_requests, args.requests)
    return args


def _sweep_system_tokens(head_tokens: int) -> int:
    return int(head_tokens / 0.9) + 16


def main(argv: list[str] | None = None) -> int:
    """Every mode's bad input (a ValueError from the workload, the engine or a run) is one
    line on stderr and exit code 2."""
    args = parse_args(argv)
    try:
        return _dispatch(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_at_start = os.getloadavg()[0]
    if args.fanout or args.restart or args.tiers or args.priority:
        command = " ".join(["python -m inference.engine.bench", *args.argv])
        meta = dict(command=command, started=started, load_at_start=load_at_start)
        meta["cpu"] = _cpu_model()
        if args.restart:
            return restart_main(args, meta)
        if args.priority:
            return priority_main(args, meta)
        if args.tiers:
            return tiers_main(args, meta)
        interval = args.intervals[0] if args.intervals else None
        return fanout_main(
            args, lambda shared: _engine(args, True, interval, enable_shared_prefill=shared), meta
        )
    if args.intervals is not None:
        return _sweep_main(args, started, load_at_start)
    runs, workload, floor = _run_all(args)
    summaries = {run.name: summarize(run) for run in runs}
    meta = _meta(args, workload, started, load_at_start)
    floor_lines = format_floor(floor, {n: s.requests_per_min for n, s in summaries.items()})
    if floor is not None and "cached" in summaries:
        per_token = summaries["cached"].decode_s_per_token
        floor_lines.append(
            f"decode step floor at {args.concurrency} in flight ({args.weights} weights read "
            f"once {floor.decode_weights_s * 1e3:.1f} ms, {args.kv_cache_dtype} keys once "
            f"{floor.decode_keys_s * 1e3:.1f} ms): {floor.decode_step_s * 1e3:.1f} ms; engine "
            f"decode per token {per_token * 1e3:.1f} ms = {per_token / floor.decode_step_s:.2f}× "
            "the floor"
        )
        llamacpp = summaries.get(baseline_llamacpp.NAME)
        if llamacpp is not None and llamacpp.decode_s_per_token:
            floor_lines.append(_decode_target_line(floor, llamacpp.decode_s_per_token))
        alone = summaries["cached"].steady_decode_s_per_token
        if alone:
            floor_lines.append(
                f"engine decode alone at {args.concurrency} in flight {alone * 1e3:.1f} ms = "
                f"{alone / floor.decode_step_s:.2f}× the floor"
            )
    if floor is not None:
        meta["compute_floor"] = {
            "total_s": floor.total_s,
            "requests_per_min": floor.requests_per_min,
            "prefill_linear_s": floor.prefill_linear_s,
            "prefill_attention_s": floor.prefill_attention_s,
            "decode_s": floor.decode_s,
            "uncached_prefill_s": floor.uncached_prefill_s,
            "decode_step_s": floor.decode_step_s,
            "decode_weights_s": floor.decode_weights_s,
            "decode_keys_s": floor.decode_keys_s,
            "prefill_cached_over_uncached": floor.prefill_s / floor.uncached_prefill_s,
        }
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            f.write(to_json(meta, runs, summaries, args.ticks, args.concurrency) + "\n")
    if args.json:
        print(to_json(meta, runs, summaries, args.ticks, args.concurrency))
    else:
        print(_header(meta))
        print(format_table(runs, summaries, args.ticks, args.concurrency))
        if "cached" in summaries:
            print("\n".join(floor_lines))
    return 0


def _decode_target_line(floor: Floor, llamacpp_s_per_token: float) -> str:
    """What the per-request decode target (≥ 0.5× llama.cpp's single stream, a token per step
    for each sequence) allows a step, against the floor of torch's own kernels."""
    allowed = 2 * llamacpp_s_per_token
    left = allowed - floor.decode_step_s
    head = (
        f"decode target (each request ≥ 0.5× llama.cpp's {llamacpp_s_per_token * 1e3:.1f} ms a "
        f"token) allows a step of {allowed * 1e3:.1f} ms: "
    )
    if left >= 0:
        return head + f"the floor leaves {left * 1e3:.1f} ms ({left / allowed:.0%}) for the rest"
    return head + (
        f"the floor is {-left * 1e3:.1f} ms ({-left / allowed:.0%}) over it, so no engine on "
        "these kernels meets it on this machine"
    )


def _sweep_main(args: argparse.Namespace, started: str, load_at_start: float) -> int:
    def workload_of(engine: LLMEngine) -> Workload:
        return build_workload(
            chat_tokenizer_for(engine.tokenizer),
            num_requests=args.requests,
            head_tokens=_sweep_system_tokens(args.head_tokens),
            prompt_token_range=args.prompt_token_range,
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
        lambda caching, interval: _engine(args, caching, interval, **flags),
        workload_of,
        args.intervals,
        head_tokens=args.head_tokens,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        progress=progress,
        breakpoint=args.head_tokens if exact else None,
    )
    meta = _meta(args, workload, started, load_at_start)
    meta["workload"]["head_tokens"] = args.head_tokens
    meta["workload"]["shared_prefix_tokens"] = args.head_tokens  # exactly: see retention_sweep
    meta["workload"]["prompt_tokens"] = [m.num_prompt_tokens for m in runs[0].metrics]
    data = {**meta, "retention_sweep": sweep_json(runs)}
    return emit(args, data, f"{_header(meta)}\n{format_sweep(runs)}")


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
    engine = _engine(args, spec.enable_prefix_caching, **engine_options)
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


def _engine(
    args: argparse.Namespace,
    enable_prefix_caching: bool,
    retention_interval: int | None = None,
    enable_jump_forward: bool = True,
    **overrides,
) -> LLMEngine:
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


def _workload(engine: LLMEngine, args: argparse.Namespace) -> Workload:
    return _workload_of(engine.tokenizer, args)


def _workload_of(tokenizer, args: argparse.Namespace) -> Workload:
    return build_workload(
        tokenizer,
        num_requests=args.requests,
        head_tokens=args.head_tokens,
        prompt_token_range=args.prompt_token_range,
        seed=args.seed,
        ticks=args.ticks,
    )


def _meta(args: argparse.Namespace, workload: Workload, started: str, load: float) -> dict:
    return {
        "command": " ".join(["python -m inference.engine.bench", *args.argv]),
        "machine": {
            "nproc": os.cpu_count(),
            "cpu": _cpu_model(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "date": started,
            # The machine is shared: a load above the core count means the numbers are noisy.
            "load_avg_1m_at_start": round(load, 2),
        },
        "workload": {
            "model": args.model,
            "seed": workload.seed,
            "num_requests": len(workload.requests),
            "concurrency": args.concurrency,
            "max_tokens": args.max_tokens,
            "ticks": args.ticks,
            "weights": ",".join([args.weights, *args.more_weights]),
            "kv_cache_dtype": ",".join([args.kv_cache_dtype, *args.more_kv_cache_dtypes]),
            "prefill_chunk_while_decoding": args.prefill_chunk_while_decoding,
            "head_tokens": workload.num_head_tokens,
            "shared_prefix_tokens": workload.num_shared_prefix_tokens,
            "prompt_tokens": workload.prompt_token_counts,
            "num_targets": len(workload.schema["properties"]["target"]["enum"]),
        },
    }


def _header(meta: dict) -> str:
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


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
