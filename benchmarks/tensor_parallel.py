"""`python -m benchmarks tensor-parallel`: what splitting a model over ranks costs.

Runs the same greedy requests (random prompt tokens, no prefix caching) on the single-process
engine and on a tensor-parallel one (ranks spawned on this machine), timing every step and, on
the parallel engine, rank 0's collectives within it (calls, bytes, seconds; from
Communicator's stats). Prints one row per engine and step kind (prefill: a step computing
prompt tokens; decode: the others). On CPU with gloo this is the correctness path; the
numbers say what the communication costs, not that splitting is faster here.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.distributed.communicator import (
    CommStats,
    close_distributed,
    free_port,
    init_distributed,
)


@dataclass(slots=True)
class StepTiming:
    kind: str  # "prefill" or "decode"
    num_tokens: int
    seconds: float
    comm: CommStats | None  # rank 0's collectives in the step (None: one process)


@dataclass(slots=True)
class KindSummary:
    engine: str
    kind: str
    num_steps: int
    tokens_per_step: float
    step_ms: float  # median
    comm_ms: float  # median of rank 0's time inside collectives
    comm_bytes: float  # mean bytes rank 0 sent or contributed per step
    comm_calls: float  # mean collectives per step
    bytes_by_op: dict[str, float] = field(default_factory=dict)


def time_steps(engine: LLMEngine) -> list[StepTiming]:
    """Record every step's time (and collectives) from now on."""
    runner = engine.runner
    execute = runner.execute
    parallel = engine.executor
    steps: list[StepTiming] = []

    def timed_execute(output):
        kind = "prefill" if output.num_prefill_tokens else "decode"
        if parallel is not None:
            parallel.reset_comm_stats()
        started = time.perf_counter()
        result = execute(output)
        seconds = time.perf_counter() - started
        comm = parallel.make_comm_stats() if parallel is not None else None
        steps.append(StepTiming(kind, output.num_scheduled_tokens, seconds, comm))
        return result

    runner.execute = timed_execute
    return steps


def summarize(engine_name: str, steps: list[StepTiming]) -> list[KindSummary]:
    rows = []
    for kind in ("prefill", "decode"):
        mine = [s for s in steps if s.kind == kind]
        if not mine:
            continue
        comms = [s.comm for s in mine if s.comm is not None]
        ops = sorted({op for c in comms for op in c.ops})
        rows.append(
            KindSummary(
                engine=engine_name,
                kind=kind,
                num_steps=len(mine),
                tokens_per_step=statistics.mean(s.num_tokens for s in mine),
                step_ms=1000 * statistics.median(s.seconds for s in mine),
                comm_ms=1000 * statistics.median(c.seconds for c in comms) if comms else 0.0,
                comm_bytes=statistics.mean(c.num_bytes for c in comms) if comms else 0.0,
                comm_calls=(
                    statistics.mean(sum(o.num_calls for o in c.ops.values()) for c in comms)
                    if comms
                    else 0.0
                ),
                bytes_by_op={
                    op: statistics.mean(c.ops[op].num_bytes if op in c.ops else 0 for c in comms)
                    for op in ops
                },
            )
        )
    return rows


def run(
    model: str, prompts: list[list[int]], max_tokens: int, threads: int, **parallel
) -> list[StepTiming]:
    engine = LLMEngine(
        EngineConfig(model=model, num_threads=threads, enable_prefix_caching=False, **parallel)
    )
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        engine.generate(prompts[:1], SamplingParams(max_tokens=2, temperature=0.0))  # warm up
        steps = time_steps(engine)
        engine.generate(prompts, params)
        return steps
    finally:
        engine.shutdown()


def _time_all_reduce(rank: int, port: int, sizes: list[int], repeats: int, out) -> None:
    """(a spawned rank) Median seconds of an all-reduce of each size, after a warm-up."""
    comm = init_distributed(rank, 2, "127.0.0.1", port, torch.device("cpu"), 60.0)
    torch.set_num_threads(1)
    try:
        medians = []
        for size in sizes:
            x = torch.ones(size // 4)
            for _ in range(3):
                comm.all_reduce(x)
            times = []
            for _ in range(repeats):
                dist.barrier()
                started = time.perf_counter()
                comm.all_reduce(x)
                times.append(time.perf_counter() - started)
            medians.append(statistics.median(times))
        if rank == 0:
            out.put(medians)
    finally:
        close_distributed()


def time_all_reduce(sizes: list[int], repeats: int = 50) -> list[float]:
    """Median seconds of a gloo all-reduce between two processes on this machine, per size in
    bytes: the transfer alone (both ranks start together), without a step's wait for the
    slower rank."""
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    workers = [
        context.Process(target=_time_all_reduce, args=(rank, port, sizes, repeats, results))
        for rank in range(2)
    ]
    for worker in workers:
        worker.start()
    medians = results.get(timeout=600)
    for worker in workers:
        worker.join(60)
    return medians


def format_rows(rows: list[KindSummary]) -> str:
    lines = [
        f"{'engine':<14}{'kind':<9}{'steps':>6}{'tok/step':>9}{'step ms':>9}{'comm ms':>9}"
        f"{'comm %':>8}{'KiB/step':>10}{'calls':>7}  bytes by op"
    ]
    for r in rows:
        share = 100 * r.comm_ms / r.step_ms if r.step_ms else 0.0
        by_op = ", ".join(f"{op} {b / 1024:.1f} KiB" for op, b in r.bytes_by_op.items())
        lines.append(
            f"{r.engine:<14}{r.kind:<9}{r.num_steps:>6}{r.tokens_per_step:>9.0f}"
            f"{r.step_ms:>9.1f}{r.comm_ms:>9.1f}{share:>7.0f}%{r.comm_bytes / 1024:>10.1f}"
            f"{r.comm_calls:>7.0f}  {by_op}"
        )
    return "\n".join(lines)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tp", type=int, default=2, help="ranks of the parallel engine")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=64, help="decode steps per request")
    parser.add_argument("--batch", type=int, default=1, help="requests at once")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, one process")
    parser.add_argument("--rank-threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument(
        "--all-reduce-bytes",
        default="",
        help="comma-separated sizes: also time a bare all-reduce of each between two processes",
    )
    parser.add_argument("--json", action="store_true")


def main(args: argparse.Namespace) -> int:
    rng = random.Random(0)
    prompts = [
        [rng.randrange(1000, 40000) for _ in range(args.prompt_tokens)] for _ in range(args.batch)
    ]
    print("single process ...", file=sys.stderr)
    single = run(args.model, prompts, args.max_tokens, args.threads)
    print(f"{args.tp} ranks ...", file=sys.stderr)
    split = run(
        args.model, prompts, args.max_tokens, args.rank_threads, tensor_parallel_size=args.tp
    )
    rows = summarize("1 process", single) + summarize(f"{args.tp} ranks", split)
    sizes = [int(size) for size in args.all_reduce_bytes.split(",") if size]
    bare = dict(zip(sizes, time_all_reduce(sizes), strict=True)) if sizes else {}
    if args.json:
        print(json.dumps({"steps": [asdict(r) for r in rows], "all_reduce_s": bare}, indent=2))
        return 0
    print(format_rows(rows))
    for size, seconds in bare.items():
        print(f"bare all-reduce of {size} bytes between two processes: {1000 * seconds:.3f} ms")
    return 0
