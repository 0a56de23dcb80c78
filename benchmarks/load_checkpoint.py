"""Load time and memory of a DeepSeek-V4 checkpoint (docs/PERFORMANCE.md, issue 31's section).

    python -m benchmarks load-checkpoint --write DIR     # the mid-size checkpoint
    python -m benchmarks load-checkpoint DIR [--rank R --world-size N]

The second form loads DIR with `load_model` in this (fresh) process and prints one JSON line:
the packed bytes on disk, seconds to load, resident memory before and after (VmRSS) and its
peak (VmHWM), and the bytes the model holds by kind. It uses only `load_model(path, cpu)`, so the
same file measures an older tree's loader too (PYTHONPATH=<old tree> python <this file> DIR;
the old loader needs a tokenizer.json: `--write DIR --tokenizer` copies the tiny model's).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

# hidden 1024, 32 experts of 1024, 6 layers + MTP: 0.43 GB packed, 3.4 GB as fp32.
MID_OVERRIDES = {
    "vocab_size": 4096,
    "hidden_size": 1024,
    "moe_intermediate_size": 1024,
    "n_routed_experts": 32,
    "num_experts_per_tok": 4,
    "num_attention_heads": 8,
    "head_dim": 128,
    "q_lora_rank": 256,
    "o_lora_rank": 256,
    "index_n_heads": 8,
    "index_head_dim": 64,
}


def mid_config() -> dict:
    from inference.engine.models.deepseek_v4.tiny import TINY_CONFIG

    return {**TINY_CONFIG, **MID_OVERRIDES}


def memory_kib() -> dict[str, int]:
    """VmRSS and VmHWM of this process, KiB (Linux)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


def measure(path: Path, rank: int | None = None, world_size: int | None = None) -> dict:
    import torch

    from inference.engine.models import load_model

    shard = None
    if world_size is not None:
        from inference.engine.loading.shard import Shard

        shard = Shard(rank or 0, world_size)
    torch.set_num_threads(1)
    before = memory_kib()
    started = time.perf_counter()
    loaded = load_model(str(path), torch.device("cpu"), **({"shard": shard} if shard else {}))
    seconds = time.perf_counter() - started
    after = memory_kib()
    result = {
        "packed_bytes": sum(f.stat().st_size for f in path.glob("*.safetensors")),
        "load_s": round(seconds, 2),
        "rss_before_kib": before["VmRSS"],
        "rss_after_kib": after["VmRSS"],
        "hwm_kib": after["VmHWM"],
    }
    try:
        from inference.engine.models.deepseek_v4.held_bytes import held_bytes
    except ImportError:  # an older tree
        return result
    result["held"] = dataclasses.asdict(held_bytes(loaded.model))
    return result


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path)
    parser.add_argument("--write", action="store_true", help="write the mid-size checkpoint")
    parser.add_argument("--tokenizer", action="store_true", help="with the tiny tokenizer")
    parser.add_argument("--rank", type=int)
    parser.add_argument("--world-size", type=int)


def main(args: argparse.Namespace) -> int:
    if args.write:
        from inference.engine.models.deepseek_v4.packed_checkpoint import write_packed_checkpoint

        written = write_packed_checkpoint(args.path, mid_config())
        if args.tokenizer:
            from inference.engine.models.deepseek_v4.tiny import tiny_checkpoint

            for name in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(tiny_checkpoint(0) / name, args.path / name)
        print(json.dumps({"written_bytes": written}))
        return 0
    print(json.dumps(measure(args.path, args.rank, args.world_size)))
    return 0


if __name__ == "__main__":  # run as a file, beside an older tree's loader (see above)
    _parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cli_args(_parser)
    sys.exit(main(_parser.parse_args()))
