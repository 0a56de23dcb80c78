"""bench_routing, the old name of `python -m benchmarks node-policies`, kept for one release.

It says so on stderr, then replaces its process with the new command (exec) with the same
arguments, so the town never imports benchmarks/ (it runs this repository's, wherever the
command was started). Django's own options (--settings, --pythonpath, --verbosity, ...) are not
the new command's: manage.py has put --settings in DJANGO_SETTINGS_MODULE already, which the new
command reads, and --pythonpath goes on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from django.core.management.base import BaseCommand

REPO_ROOT = Path(__file__).resolve().parents[3]
NEW = ["-m", "benchmarks", "node-policies"]


def django_options_dropped(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Django's options every command takes, parsed out of `argv`, and the rest."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--settings")
    parser.add_argument("--pythonpath")
    parser.add_argument("-v", "--verbosity")
    for flag in ("--traceback", "--no-color", "--force-color", "--skip-checks"):
        parser.add_argument(flag, action="store_true")
    return parser.parse_known_args(argv)


class Command(BaseCommand):
    help = "Deprecated: `python -m benchmarks node-policies` (same options)."

    def run_from_argv(self, argv: list[str]) -> None:
        options, rest = django_options_dropped(argv[2:])
        paths = (str(REPO_ROOT), options.pythonpath, os.environ.get("PYTHONPATH"))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        new = " ".join(["python", *NEW, *rest])
        print(
            "note: `manage.py bench_routing` is deprecated and goes in the next release; "
            f"running `{new}`",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *NEW, *rest], env)
