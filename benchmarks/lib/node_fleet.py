"""What `python -m benchmarks node-policies` runs (benchmarks/node_policies.py): node workers on
this machine, each engine on its own torch thread budget, the demo town for a few ticks of one
scenario on them, and what it gives: token cache hit rate, tick wall time, median end-to-end,
decisions per node, and whether every decision of every tick was applied exactly once.

It reads the town's models, so Django is set up before this module is imported (the mode's
main does it). Each scenario starts its workers afresh (cold caches; runs never share cached
prefixes anyway: inference/completions/cache_salt.py) on the nodes `bench-a` and `bench-b`,
added to this process's INFERENCE_NODES only, so a `make run` on the same machine keeps its own
queues.
"""

from __future__ import annotations

import logging
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import connection

from inference.fleet.health import node_states
from town import services
from town.demo import DEMO_TOWN_NAME, demo_town_create
from town.models import Decision, Run, Town
from town.selectors import run_summary
from town.simulation import tick_run
from town.tasks import decision_send

if TYPE_CHECKING:
    from benchmarks.node_policies import Scenario

logger = logging.getLogger(__name__)

BASE_DIR = Path(__file__).resolve().parent.parent.parent  # the repository: celery -A pokosite
NODES = ("bench-a", "bench-b")
D = Decision.Status


@dataclass(slots=True)
class ScenarioResult:
    scenario: Scenario
    run_id: int
    token_cache_hit_rate: float
    tick_wall_s: list[float]
    median_e2e_s: float
    decisions_per_node: dict[str, int]
    num_decisions: int
    num_expected: int
    num_applied: int
    num_resent: int  # sent more than once or begun more than once (failover, lost message)
    problems: list[str] = field(default_factory=list)

    @property
    def mean_tick_wall_s(self) -> float:
        return statistics.fmean(self.tick_wall_s) if self.tick_wall_s else 0.0


class NodeWorker:
    """A `celery worker` for one node, started for the bench."""

    def __init__(self, node: str, *, threads: int, kv_blocks: int | None, log_dir: Path) -> None:
        self.node = node
        self.hostname = f"{node}@{uuid.uuid4().hex[:6]}"
        self.log_path = log_dir / f"{node}.log"
        env = {
            **os.environ,
            "POKOMACHI_TORCH_THREADS": str(threads),
            "POKOMACHI_HEARTBEAT_INTERVAL": "0.5",
            "PYTHONUNBUFFERED": "1",
            **({"POKOMACHI_KV_BLOCKS": str(kv_blocks)} if kv_blocks else {}),
        }
        argv = [
            sys.executable, "-m", "celery", "-A", "pokosite", "worker", "-Q", node,
            "--pool", "threads", "--concurrency", "4", "-n", self.hostname,
            "--loglevel", "INFO", "--without-mingle", "--without-gossip",
        ]  # fmt: skip
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                argv, cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {timeout_s:g} s")
        time.sleep(0.05)


def _workers_start(
    nodes: list[str], *, threads: int, kv_blocks: int | None, log_dir: Path
) -> list[NodeWorker]:
    workers = [
        NodeWorker(node, threads=threads, kv_blocks=kv_blocks, log_dir=log_dir) for node in nodes
    ]
    try:
        _wait_for(
            lambda: all(s.is_up for s in node_states(nodes)),
            f"the node workers did not come up (logs: {log_dir})",
            timeout_s=300,
        )
    except BaseException:
        for worker in workers:
            worker.kill()
        raise
    return workers


def _town() -> Town:
    return Town.objects.filter(name=DEMO_TOWN_NAME).first() or demo_town_create(seed=0)


def scenario_run(
    scenario: Scenario,
    *,
    ticks: int,
    residents: int,
    diary_chars: int,
    layout: str,
    threads: int,
    kv_blocks: int | None,
    log_dir: Path,
    progress: Callable[[str], None],
) -> ScenarioResult:
    nodes = list(NODES[: scenario.num_nodes])
    workers = _workers_start(nodes, threads=threads, kv_blocks=kv_blocks, log_dir=log_dir)
    try:
        run = services.run_create(
            town=_town(),
            layout=layout,
            nodes=nodes,
            routing=scenario.routing,
            ticks_target=ticks,
            num_residents=residents,
            diary_chars=diary_chars,
        )
        run = services.run_start(run=run)
        walls = []
        for index in range(ticks):
            if scenario.kill_at_tick == index:
                _kill_mid_tick(run=run, worker=workers[1], progress=progress)
            started = time.perf_counter()
            tick_run(run_id=run.pk, send=decision_send, owner="bench_node_policies", poll_s=0.05)
            walls.append(time.perf_counter() - started)
            progress(f"{scenario.name}: tick {index} in {walls[-1]:.1f} s")
    finally:
        for worker in workers:
            worker.stop()
    return _result(scenario, run=run, walls=walls, expected=ticks)


def _kill_mid_tick(*, run: Run, worker: NodeWorker, progress: Callable[[str], None]) -> None:
    """Kill the worker (SIGKILL) as soon as a decision of the coming tick runs on its node: from
    a thread, while the tick loop runs the tick."""

    def killer() -> None:
        try:
            _wait_for(
                Decision.objects.filter(run=run, node=worker.node, status=D.RUNNING).exists,
                f"no decision ran on {worker.node}",
                timeout_s=600,
            )
            worker.kill()
            progress(f"killed {worker.node} (SIGKILL) mid-tick")
        finally:
            connection.close()

    threading.Thread(target=killer, daemon=True).start()


def _result(scenario: Scenario, *, run: Run, walls: list[float], expected: int) -> ScenarioResult:
    run.refresh_from_db()
    summary = run_summary(run=run)
    decisions = list(run.decisions.all())
    num_residents = run.resident_states.count()
    problems = []
    per_tick = Counter((d.tick_id, d.resident_id) for d in decisions)
    if any(n > 1 for n in per_tick.values()):
        problems.append("a resident has two decisions in one tick")
    applied = [d for d in decisions if d.status == D.APPLIED]
    if len(applied) != len(decisions):
        problems.append(f"{len(decisions) - len(applied)} decisions not applied")
    if run.num_ticks_done != expected:
        problems.append(f"{run.num_ticks_done} of {expected} ticks done")
    return ScenarioResult(
        scenario=scenario,
        run_id=run.pk,
        token_cache_hit_rate=summary.token_cache_hit_rate,
        tick_wall_s=walls,
        median_e2e_s=summary.median_e2e_s,
        decisions_per_node=dict(sorted(Counter(d.node for d in decisions).items())),
        num_decisions=len(decisions),
        num_expected=expected * num_residents,
        num_applied=len(applied),
        num_resent=sum(1 for d in decisions if d.num_sends > 1 or d.attempts > 1),
        problems=problems,
    )


def bench_table(results: list[ScenarioResult]) -> str:
    header = (
        "| scenario | run | hit rate | tick wall, mean (s) | median e2e (s) | decisions per node "
        "| applied / expected | resent or retried |"
    )
    lines = [header, "|" + "---|" * 8]
    for r in results:
        per_node = ", ".join(f"{n} {c}" for n, c in r.decisions_per_node.items())
        lines.append(
            f"| {r.scenario.name} | {r.run_id} | {100 * r.token_cache_hit_rate:.2f}% "
            f"| {r.mean_tick_wall_s:.1f} | {r.median_e2e_s:.2f} | {per_node} "
            f"| {r.num_applied} / {r.num_expected} | {r.num_resent} |"
        )
    return "\n".join(lines)


def bench_nodes_register() -> None:
    """Let runs of this process name the bench's nodes (node_require checks the settings)."""
    settings.INFERENCE_NODES = [*settings.INFERENCE_NODES, *NODES]
