"""bench_routing: routing policies side by side on two local node workers (town/bench/)."""

from __future__ import annotations

import os
import platform
import tempfile
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from town.bench.routing import SCENARIOS, bench_nodes_register, bench_table, scenario_run
from town.rules.prompts import LAYOUTS


class Command(BaseCommand):
    help = (
        "Start two node workers on this machine (bench-a, bench-b; one torch thread each) and run "
        "the demo town under each routing policy and on one node; print hit rate, tick wall "
        "time, median end-to-end and decisions per node. The model is POKOMACHI_MODEL's."
    )

    def add_arguments(self, parser):
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

    def handle(
        self, *args, ticks, residents, diary_chars, layout, threads, kv_blocks, scenarios, **options
    ):
        names = [n.strip() for n in scenarios.split(",") if n.strip()]
        unknown = [n for n in names if n not in SCENARIOS]
        if unknown or not names:
            raise CommandError(f"unknown scenarios {unknown}; pick from {', '.join(SCENARIOS)}")
        if ticks < 3 and "failover" in names:
            raise CommandError("failover kills a node in tick 2: give --ticks 3 or more")
        bench_nodes_register()
        log_dir = Path(tempfile.mkdtemp(prefix="bench-routing-"))
        load = os.getloadavg()
        self.stdout.write(
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load "
            f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; KV pool {kv_blocks or 'default'} "
            f"blocks; worker logs in {log_dir}"
        )
        results = []
        for name in names:
            results.append(
                scenario_run(
                    SCENARIOS[name],
                    ticks=ticks,
                    residents=residents,
                    diary_chars=diary_chars,
                    layout=layout,
                    threads=threads,
                    kv_blocks=kv_blocks,
                    log_dir=log_dir,
                    progress=self.stdout.write,
                )
            )
        self.stdout.write(bench_table(results))
        for result in results:
            for problem in result.problems:
                self.stderr.write(f"{result.scenario.name}: {problem}")
        if any(r.problems for r in results):
            raise CommandError("some decisions were lost or applied twice (see above)")
