"""The old name of the benchmarks, kept for one release: `python -m inference.engine.bench ...`
and `python -m inference.engine.bench.<module> ...` run `python -m benchmarks <mode> ...`.

Each prints a one-line note on stderr, then replaces its process with the new command (exec), so
the engine's package never imports benchmarks/. The old flag-style modes map to subcommands:
`--restart`, `--priority`, `--tiers`, `--fanout` (in that order when several are given, as
before), then `--retention-interval` (retention-sweep); anything else is `town`.
"""

from __future__ import annotations

import os
import sys

MODE_FLAGS = {
    "--restart": "restart",
    "--priority": "priority",
    "--tiers": "tiers",
    "--fanout": "fanout",
}


def translate(argv: list[str]) -> list[str]:
    """The old `python -m inference.engine.bench` arguments as `python -m benchmarks` ones."""
    for flag, mode in MODE_FLAGS.items():
        if flag in argv:
            return [mode, *(arg for arg in argv if arg not in MODE_FLAGS)]
    if any(arg.split("=")[0] == "--retention-interval" for arg in argv):
        return ["retention-sweep", *argv]
    return ["town", *argv]


def run_benchmarks(old: str, argv: list[str]) -> None:
    """Say what the old command `old` is now, then run it as `python -m benchmarks argv`."""
    command = [sys.executable, "-m", "benchmarks", *argv]
    print(
        f"note: `python -m {old}` is deprecated and goes in the next release; running "
        f"`python -m benchmarks {' '.join(argv)}`",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    os.execv(sys.executable, command)
