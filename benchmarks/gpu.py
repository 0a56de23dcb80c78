"""The GPU benchmark: `python -m benchmarks gpu [--quick]` on a machine with CUDA.

1. Kernels at real sizes: each checked against its torch reference (bf16 tolerances), then
   timed with triton's do_bench (median), beside the bytes it must move and the bandwidth
   that makes, as a share of a measured device-to-device copy.
2. The engine on CUDA in bf16 (triton kernels, CUDA graphs): the town benchmark's requests/s
   with the prefix cache on and off, decode tokens/s at 4 / 16 / 64 in flight, and the same
   decode measure on this machine's CPU (torch path) for the ×10 target. SmolLM2, then
   Gemma 3 270M when that model name is registered.
3. DeepSeek-V4: a mid-size FP8/FP4 checkpoint decoding at 1 / 4 / 16 in flight (tokens/s, the
   bytes a step reads and their share of the copy bandwidth) and its prefill (lib/gpu_v4.py).

Prints one table; progress goes to stderr. Exit status: 0 when every kernel matched its
reference, 1 when one did not, 2 without CUDA. A full run takes ~3-5 minutes on an H200
(under 8); --quick is about a minute.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from inference.engine.loading.model_files import known_model_names

MODELS = ("smollm2-135m-instruct", "gemma3-270m")
TIME_BUDGET_S = 7 * 60  # sections still to run past this are skipped, saying so
TARGET_DECODE_SHARE = 0.60  # decode attention at 64 × 4k, of the copy bandwidth
TARGET_CPU_RATIO = 10.0  # engine decode at 16 in flight, GPU over CPU


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer requests")
    parser.add_argument("--skip-engine", action="store_true", help="kernels only")
    parser.add_argument("--skip-cpu", action="store_true", help="no CPU decode baseline")


def main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print(
            "benchmarks/gpu.py needs a CUDA GPU and this machine has none "
            "(torch.cuda.is_available() is False). Run it on a GPU node; "
            "the CPU benchmark is `python -m benchmarks town`.",
            file=sys.stderr,
        )
        return 2
    from benchmarks.lib.gpu_kernels import copy_bandwidth_gb_per_s, run_kernel_benchmarks
    from benchmarks.lib.gpu_v4_kernels import v4_indexer_compress_cases

    started = time.monotonic()
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(device)} · torch {torch.__version__} · "
          f"{'quick' if args.quick else 'full'} run")  # fmt: skip
    copy_gbs = copy_bandwidth_gb_per_s(device, args.quick)
    kernels = run_kernel_benchmarks(device, args.quick)
    kernels += v4_indexer_compress_cases(device, torch.Generator().manual_seed(0), args.quick)
    print(_kernel_table(kernels, copy_gbs))
    engines = []
    if not args.skip_engine:
        from benchmarks.lib.gpu_engine import run_engine_benchmarks

        for model in MODELS:
            if model not in known_model_names():
                print(f"\n{model}: not a registered model name here, skipped")
                continue
            deadline = started + TIME_BUDGET_S
            if time.monotonic() > deadline:
                print(f"\n{model}: skipped, the {TIME_BUDGET_S} s budget is spent")
                continue
            try:
                engines.append(run_engine_benchmarks(model, args.quick, deadline,
                                                     with_cpu=not args.skip_cpu))  # fmt: skip
            except Exception as exc:  # one model failing must not hide the others' numbers
                print(f"\n{model}: failed: {type(exc).__name__}: {exc}")
        for result in engines:
            print(_engine_table(result))
        _v4_section(device, args.quick, copy_gbs, started + TIME_BUDGET_S)
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    return 0 if all(k.ok for k in kernels) else 1


def _v4_section(device: torch.device, quick: bool, copy_gbs: float, deadline: float) -> None:
    """DeepSeek-V4's mid-size packed checkpoint at 1 / 4 / 16 in flight (lib/gpu_v4.py)."""
    if time.monotonic() > deadline:
        print(f"\ndeepseek-v4: skipped, the {TIME_BUDGET_S} s budget is spent")
        return
    from benchmarks.lib.gpu_v4 import run_v4_section, v4_table

    try:
        result = run_v4_section("cuda", quick)
    except Exception as exc:  # like a model above: its failure must not hide the other numbers
        print(f"\ndeepseek-v4: failed: {type(exc).__name__}: {exc}")
        return
    print(v4_table(result, copy_gbs, torch.cuda.get_device_name(device)))


def _kernel_table(kernels, copy_gbs: float) -> str:
    lines = [
        f"\ndevice-to-device copy: {copy_gbs:,.0f} GB/s (read + write)\n",
        "| kernel | shape | check | median µs | MB moved | GB/s | % of copy | TFLOP/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k in kernels:
        check = "—" if k.max_error is None and k.ok else ("ok" if k.ok else "FAIL")
        if k.max_error:
            check += f" ({k.max_error:.1e})"
        tflops = f"{k.flops / k.ms / 1e9:.1f}" if k.flops else ""
        lines.append(
            f"| {k.name} | {k.shape} | {check} | {k.ms * 1e3:,.1f} | {k.bytes_moved / 1e6:,.1f} "
            f"| {k.gb_per_s():,.0f} | {100 * k.gb_per_s() / copy_gbs:.0f}% | {tflops} |"
        )
    target = next((k for k in kernels if k.name == "decode" and k.shape.startswith("64×")), None)
    if target is not None:
        share = target.gb_per_s() / copy_gbs
        verdict = "met" if share >= TARGET_DECODE_SHARE else "NOT met"
        lines.append(f"\ntarget: decode attention at 64 seqs ≥ {TARGET_DECODE_SHARE:.0%} of copy "
                     f"bandwidth: {share:.0%} ({verdict})")  # fmt: skip
    return "\n".join(lines)


def _engine_table(r) -> str:
    lines = [f"\n{r.model} (bf16, triton kernels, CUDA graphs), town workload\n",
             "| measure | value |", "|---|---|"]  # fmt: skip
    for run, value in r.requests_per_s.items():
        lines.append(f"| requests/s, prefix cache {'on' if run == 'cached' else 'off'} "
                     f"(16 in flight) | {value:.2f} |")  # fmt: skip
    if r.cache_hit_rate is not None:
        lines.append(f"| token cache hit rate | {r.cache_hit_rate:.1%} |")
    if {"cached", "uncached"} <= r.mean_prefill_s.keys():
        cached, uncached = r.mean_prefill_s["cached"], r.mean_prefill_s["uncached"]
        lines.append(f"| mean prefill s, cached / uncached | {cached:.3f} / {uncached:.3f} "
                     f"(×{cached / uncached:.2f}) |")  # fmt: skip
    for concurrency, tps in r.decode_tokens_per_s.items():
        lines.append(f"| decode tokens/s, {concurrency} in flight | {tps:,.0f} |")
    if r.decode_16_without_graphs is not None:
        lines.append(f"| decode tokens/s, 16 in flight, no CUDA graphs | "
                     f"{r.decode_16_without_graphs:,.0f} |")  # fmt: skip
    if r.cpu_decode_16 is not None and 16 in r.decode_tokens_per_s:
        ratio = r.decode_tokens_per_s[16] / r.cpu_decode_16
        verdict = "met" if ratio >= TARGET_CPU_RATIO else "NOT met"
        lines.append(f"| decode tokens/s, 16 in flight, this CPU (fp32 torch path) | "
                     f"{r.cpu_decode_16:,.1f} |")  # fmt: skip
        lines.append(f"| GPU / CPU decode at 16 (target ≥ {TARGET_CPU_RATIO:.0f}×) | "
                     f"×{ratio:.1f} ({verdict}) |")  # fmt: skip
    lines += [f"\nnote: {note}" for note in r.notes]
    return "\n".join(lines)
