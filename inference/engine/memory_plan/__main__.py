"""`python -m inference.engine.memory_plan --model M [...]`: does model M fit, per rank?

Computed from the model's config alone (no weights needed); the KV budget is everything the
weights and the reserve leave. Exit status 0 when it fits, 1 when it does not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys

from inference.engine.config import WEIGHT_FORMATS, EngineConfig
from inference.engine.memory_plan.device_memory import device_memory_bytes
from inference.engine.memory_plan.plan import GIB, plan_memory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.engine.memory_plan")
    parser.add_argument("--model", required=True, help="a model name, .gguf path, checkpoint dir")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--enable-expert-parallel", action="store_true")
    parser.add_argument(
        "--device-memory-gib",
        type=float,
        help="memory per rank (default: measured on this machine: free CUDA memory, or the "
        "host's available memory for --device cpu)",
    )
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--device", default="cuda", help="cuda (bf16) or cpu (fp32)")
    parser.add_argument("--weights", default="fp32", choices=WEIGHT_FORMATS)
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--window-cache-fraction", type=float, default=None)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = parser.parse_args(argv)
    try:
        config = EngineConfig(
            model=args.model,
            device=args.device,
            tensor_parallel_size=args.tensor_parallel_size,
            enable_expert_parallel=args.enable_expert_parallel,
            kv_cache_dtype=args.kv_cache_dtype,
            weights=args.weights,
            max_num_batched_tokens=args.max_num_batched_tokens,
            window_cache_fraction=args.window_cache_fraction,
        )
        if args.device_memory_gib is not None:
            if args.device_memory_gib <= 0:
                raise ValueError(f"--device-memory-gib must be > 0, got {args.device_memory_gib}")
            memory = int(args.device_memory_gib * GIB)
        else:
            memory = device_memory_bytes(config)
        plan = plan_memory(config, memory, kv_budget="rest")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(plan.as_json(), indent=2) if args.json else plan.table())
    return 0 if plan.fits else 1


if __name__ == "__main__":
    sys.exit(main())
