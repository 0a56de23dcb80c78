"""`python -m inference.engine.bench ...`, the old name kept for one release: the old flag-style
invocation becomes the subcommand it meant, with a one-line note on stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from inference.engine.bench import translate

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ([], ["town"]),
        (["--json", "--requests", "8"], ["town", "--json", "--requests", "8"]),
        (["--priority", "--repeats", "3"], ["priority", "--repeats", "3"]),
        (["--requests", "4", "--restart"], ["restart", "--requests", "4"]),
        (["--tiers"], ["tiers"]),
        (
            ["--fanout", "--retention-interval", "4096"],
            ["fanout", "--retention-interval", "4096"],
        ),
        (
            ["--head-tokens", "2247", "--retention-interval", "4096,dense"],
            ["retention-sweep", "--head-tokens", "2247", "--retention-interval", "4096,dense"],
        ),
        (["--retention-interval=4096"], ["retention-sweep", "--retention-interval=4096"]),
        # Several mode flags: the first of restart, priority, tiers, fanout ran, as before.
        (["--fanout", "--restart"], ["restart"]),
    ],
)
def test_old_flags_become_the_subcommand(old, new) -> None:
    assert translate(old) == new


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )


def test_the_old_name_notes_the_new_command_and_runs_it() -> None:
    result = _run("inference.engine.bench", "--runs", "cached,fastest")
    note, *rest = result.stderr.splitlines()
    assert note == (
        "note: `python -m inference.engine.bench` is deprecated and goes in the next release; "
        "running `python -m benchmarks town --runs cached,fastest`"
    )
    assert result.returncode == 2  # the new command's own refusal, exit code and all
    assert "python -m benchmarks town: error: argument --runs: unknown ['fastest']" in rest[-1]


def test_the_old_module_names_run_their_subcommand() -> None:
    result = _run("inference.engine.bench.steady_decode", "--tokens", "1")
    assert "running `python -m benchmarks steady-decode --tokens 1`" in result.stderr
    assert result.returncode == 2 and "--tokens ≥ 2" in result.stderr
