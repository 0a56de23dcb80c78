"""How every bench mode reports: progress lines on stderr, then its result as a table or JSON
(stdout), and the JSON also written to --json-out when given."""

from __future__ import annotations

import argparse
import json
import sys


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def emit(args: argparse.Namespace, data: dict, text: str) -> int:
    """Print `text` (or `data` as JSON with --json), write `data` to --json-out; exit code 0."""
    as_json = json.dumps(data, ensure_ascii=False, indent=2)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            f.write(as_json + "\n")
    print(as_json if args.json else text)
    return 0
