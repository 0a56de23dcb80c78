"""`python -m benchmarks node-policies` (was `manage.py bench_routing`): its scenarios name the
town's routing policies, it refuses bad input before it sets up Django or starts a worker, and
the old command, kept for one release, says it moved and runs the new one with its arguments.
The bench itself (node workers, the demo town) is run by hand: docs/PERFORMANCE.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.node_policies import SCENARIOS
from town.management.commands.bench_routing import django_options_dropped
from town.models import RunRouting

REPO_ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )


def test_every_scenario_is_a_routing_policy_of_the_town() -> None:
    assert {s.routing for s in SCENARIOS.values()} == set(RunRouting.values)
    assert [s.name for s in SCENARIOS.values()] == list(SCENARIOS)


def test_bad_input_is_one_line_and_exit_code_2() -> None:
    result = _run("-m", "benchmarks", "node-policies", "--scenarios", "one_node,nope")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: unknown scenarios ['nope']; pick from cache_aware, round_robin, one_node, failover"
    )
    result = _run("-m", "benchmarks", "node-policies", "--ticks", "2", "--scenarios", "failover")
    assert result.returncode == 2
    assert "failover kills a node in tick 2: give --ticks 3 or more" in result.stderr


def test_the_old_command_notes_the_new_one_and_runs_it() -> None:
    result = _run(
        "manage.py", "bench_routing", "--settings", "pokosite.settings.test", "--ticks", "2",
        "--scenarios=failover", "-v", "2",
    )  # fmt: skip
    note, *rest = result.stderr.splitlines()
    assert note == (
        "note: `manage.py bench_routing` is deprecated and goes in the next release; running "
        "`python -m benchmarks node-policies --ticks 2 --scenarios=failover`"
    )
    assert result.returncode == 2  # the new command's own refusal
    assert rest == ["error: failover kills a node in tick 2: give --ticks 3 or more"]


def test_the_old_command_keeps_its_own_options_and_drops_djangos() -> None:
    options, rest = django_options_dropped(
        ["--pythonpath=/x", "--kv-blocks", "900", "--traceback", "--settings", "s", "--ticks=4"]
    )
    assert rest == ["--kv-blocks", "900", "--ticks=4"]
    assert (options.pythonpath, options.settings, options.traceback) == ("/x", "s", True)
