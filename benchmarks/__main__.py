"""`python -m benchmarks <mode> [options]`: one subcommand per benchmark mode.

`python -m benchmarks <mode> --help` lists a mode's options. Progress goes to stderr, results to
stdout. Every mode's bad input (a ValueError from the workload, the engine or a run) is one line
on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks import (
    fanout,
    gpu,
    load_checkpoint,
    node_policies,
    priority,
    restart,
    retention_sweep,
    roofline,
    steady_decode,
    tensor_parallel,
    tiers,
    town,
    v4_ops,
    v4_step,
    weights_agreement,
)

PROG = "python -m benchmarks"

MODES = {
    "town": (town, "the town-shaped workload: engine runs vs transformers and llama.cpp"),
    "retention-sweep": (retention_sweep, "one shared head under several retention policies"),
    "fanout": (fanout, "N requests sharing an uncached head at once: one prefill per head"),
    "tiers": (tiers, "TTFT with the head cold, on disk, in host memory, in the device pool"),
    "restart": (restart, "tick 2 after a worker restart, disk tier on and off"),
    "priority": (priority, "a short request's TTFT idle and with the town in flight"),
    "steady-decode": (steady_decode, "decode alone on a fresh engine, at N in flight and at 1"),
    "weights-agreement": (weights_agreement, "quantized weight formats against fp32"),
    "tensor-parallel": (tensor_parallel, "what splitting a model over ranks costs"),
    "load-checkpoint": (load_checkpoint, "load time and memory of a DeepSeek-V4 checkpoint"),
    "roofline": (roofline, "DeepSeek-V4's decode bound from memory bandwidth (config only)"),
    "v4-step": (v4_step, "DeepSeek-V4's decode step time against the bytes it reads"),
    "v4-ops": (v4_ops, "DeepSeek-V4's small ops on the CPU: a decode step's, mHC's"),
    "node-policies": (
        node_policies,
        "the node routing policies on two local node workers, the demo town (Django)",
    ),
    "gpu": (gpu, "kernels at real sizes and the engine on CUDA (needs a GPU)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    modes = parser.add_subparsers(dest="mode", required=True, metavar="<mode>")
    for name, (module, summary) in MODES.items():
        sub = modes.add_parser(
            name,
            help=summary,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_cli_args(sub)
        sub.set_defaults(main=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.command = " ".join([PROG, *argv])
    try:
        return args.main(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
