"""`python -m benchmarks roofline`: the decode bound memory bandwidth puts on a DeepSeek-V4
model split over ranks, computed (no weights, no device) from the memory plan's bytes and the
model's config (inference/engine/memory_plan/roofline.py says what a step reads).

Prints, per number of sequences in flight: the expected distinct routed experts a layer, the
bytes a step reads on the busiest rank (dense weights, routed experts, attention state) and on
all ranks together, the step's time at --bandwidth-gbs per rank, and the tokens/s that allows
each sequence and in aggregate; beside it a measured figure to compare (--measured-tps).
"""

from __future__ import annotations

import argparse
import json

from inference.engine.memory_plan import FLASH_NAME, model_spec
from inference.engine.memory_plan.plan import TALK_OUTPUT_TOKENS, TALK_PROMPT_TOKENS
from inference.engine.memory_plan.roofline import decode_reads

TALK_VLLM_TPS = 5.5  # the talk's vLLM on two Sparks: ~51 tokens in 9.31 s a request


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=FLASH_NAME)
    parser.add_argument("--tensor-parallel-size", type=int, default=2, help="ranks (TP + EP)")
    parser.add_argument(
        "--bandwidth-gbs", type=float, default=273.0, help="memory bandwidth per rank, GB/s"
    )
    parser.add_argument("--in-flight", default="1,4,16", help="comma-separated sequence counts")
    parser.add_argument(
        "--context-tokens",
        type=int,
        default=TALK_PROMPT_TOKENS + TALK_OUTPUT_TOKENS,
        help="each sequence's context (default: the talk's decision)",
    )
    parser.add_argument(
        "--measured-tps",
        type=float,
        default=TALK_VLLM_TPS,
        help="a measured tokens/s a request to print beside (default: the talk's vLLM)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def main(args: argparse.Namespace) -> int:
    if args.tensor_parallel_size < 1 or args.bandwidth_gbs <= 0:
        raise ValueError("--tensor-parallel-size must be >= 1 and --bandwidth-gbs > 0")
    try:
        in_flight = [int(n) for n in args.in_flight.split(",")]
    except ValueError:
        raise ValueError(
            f"--in-flight is comma-separated integers, got {args.in_flight!r}"
        ) from None
    spec = model_spec(args.model)
    reads = decode_reads(spec, args.tensor_parallel_size, in_flight, args.context_tokens)
    bandwidth = args.bandwidth_gbs * 1e9
    rows = [
        {
            "in_flight": r.num_in_flight,
            "distinct_experts_per_layer": r.distinct_experts_per_layer,
            "dense_bytes": r.dense,
            "routed_expert_bytes": r.routed_experts,
            "state_bytes": r.state,
            "rank_bytes": r.total,
            "all_ranks_bytes": r.total_all_ranks,
            "step_s": r.step_s(bandwidth),
            "tps_per_sequence": 1 / r.step_s(bandwidth),
            "tps_aggregate": r.num_in_flight / r.step_s(bandwidth),
        }
        for r in reads
    ]
    if args.json:
        print(json.dumps({"command": args.command, "rows": rows}, indent=2))
        return 0
    print(
        f"decode roofline: {spec.name}, {args.tensor_parallel_size} ranks (TP + EP) at "
        f"{args.bandwidth_gbs:g} GB/s each, {args.context_tokens:,}-token contexts "
        f"(experts {spec.formats.experts}, linears {spec.formats.linears}, rest bf16)"
    )
    print(
        "in flight  experts/layer  dense GB  experts GB  state GB  rank GB  all GB"
        "  step ms  tok/s/seq  tok/s"
    )
    for row in rows:
        print(
            f"{row['in_flight']:>9}  {row['distinct_experts_per_layer']:>13.1f}"
            f"  {row['dense_bytes'] / 1e9:>8.2f}  {row['routed_expert_bytes'] / 1e9:>10.2f}"
            f"  {row['state_bytes'] / 1e9:>8.2f}  {row['rank_bytes'] / 1e9:>7.2f}"
            f"  {row['all_ranks_bytes'] / 1e9:>6.2f}  {row['step_s'] * 1e3:>7.1f}"
            f"  {row['tps_per_sequence']:>9.1f}  {row['tps_aggregate']:>5.0f}"
        )
    print(f"measured: {args.measured_tps:g} tokens/s a request")
    return 0
