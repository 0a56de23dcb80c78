"""`python -m benchmarks node-policies`: the node routing policies (inference/fleet/router.py)
side by side on two node workers started on this machine (bench-a, bench-b; one torch thread
each), the demo town for a few ticks under each policy and on one node. A last scenario kills
one node (SIGKILL) in the middle of the run and checks that every decision of every tick was
applied exactly once.

Prints the machine, then per scenario the token cache hit rate, the mean tick wall time, the
median end-to-end and the decisions per node. The model is POKOMACHI_MODEL's; the town's
database and queues are those of DJANGO_SETTINGS_MODULE (default pokosite.settings.base, as
manage.py). Exit code 1 when a decision was lost or applied twice. Was `manage.py bench_routing`.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.lib.output import progress
from town.rules.prompts import LAYOUTS


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    routing: str  # a town.models.RunRouting value
    num_nodes: int
    kill_at_tick: int | None = None  # kill the second node while this tick runs


SCENARIOS = {
    "cache_aware": Scenario("cache_aware", "cache_aware", 2),
    "round_robin": Scenario("round_robin", "round_robin", 2),
    "one_node": Scenario("one_node", "fixed", 1),
    "failover": Scenario("failover", "cache_aware", 2, kill_at_tick=2),
}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ticks", type=int, default=4, help="ticks per scenario (4)")
    parser.add_argument("--residents", type=int, default=9, help="residents taking part (9)")
    parser.add_argument(
        "--diary-chars", type=int, default=2000, help="older diary per prompt (2000)"
    )
    parser.add_argument("--layout", choices=LAYOUTS, default="shared_then_resident_head")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker (1)")
    parser.add_argument(
        "--kv-blocks",
        type=int,
        default=None,
        help="KV pool per worker, in blocks of 16 tokens (default: the engine's byte budget)",
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated, from {', '.join(SCENARIOS)} (all)",
    )


def django_setup() -> None:
    """Django as a standalone script sets it up: manage.py's settings unless the caller names
    others."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pokosite.settings.base")
    import django

    django.setup()


def main(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        raise ValueError(f"unknown scenarios {unknown}; pick from {', '.join(SCENARIOS)}")
    if args.ticks < 3 and "failover" in names:
        raise ValueError("failover kills a node in tick 2: give --ticks 3 or more")
    django_setup()
    from benchmarks.lib.node_fleet import bench_nodes_register, bench_table, scenario_run

    bench_nodes_register()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-node-policies-"))
    load = os.getloadavg()
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; KV pool {args.kv_blocks or 'default'} "
        f"blocks; worker logs in {log_dir}",
        flush=True,
    )
    results = [
        scenario_run(
            SCENARIOS[name],
            ticks=args.ticks,
            residents=args.residents,
            diary_chars=args.diary_chars,
            layout=args.layout,
            threads=args.threads,
            kv_blocks=args.kv_blocks,
            log_dir=log_dir,
            progress=progress,
        )
        for name in names
    ]
    print(bench_table(results))
    for result in results:
        for problem in result.problems:
            print(f"{result.scenario.name}: {problem}", file=sys.stderr)
    if any(r.problems for r in results):
        print("error: some decisions were lost or applied twice (see above)", file=sys.stderr)
        return 1
    return 0
