"""`python -m benchmarks v4-ops`: a decode step's ops counted by the file that issued them, and
mHC's compiled gates timed against the tensor ops, three prefill pieces against the forms they
replaced, the logits head's compiled loop against F.linear and the compiled RMS norm against
torch's."""

from __future__ import annotations

import re

from benchmarks.__main__ import main


def test_refuses_bad_options(capsys) -> None:
    assert main(["v4-ops", "--in-flight", "0"]) == 2
    assert "--in-flight and --calls must be ≥ 1" in capsys.readouterr().err


def test_counts_a_decode_steps_ops_and_times_both_forms(capsys) -> None:
    assert main(["v4-ops", "--in-flight", "2", "--calls", "10"]) == 0
    out = capsys.readouterr().out
    total = int(re.search(r"torch ops: (\d+)", out).group(1))
    per_file = [int(n) for n in re.findall(r"^\s+(\d+)\s+engine/", out, re.MULTILINE)]
    assert total > 500 and sum(per_file) == total  # every op is some file's
    assert "engine/models/deepseek_v4/attention.py" in out
    times = re.findall(r"(\d+) tokens:\s+([\d.]+) /\s+([\d.]+)", out)
    assert [t[0] for t in times] == ["8", "800"] and all(float(v) > 0 for t in times for v in t[1:])
    pieces = re.findall(r"^\s+([a-z ]+):\s+([\d.]+) /\s+([\d.]+)$", out, re.MULTILINE)
    assert [p[0] for p in pieces] == [
        "streams mixed back",
        "routed experts",
        "window logits masked",
    ]
    assert all(float(v) > 0 for p in pieces for v in p[1:])
    head = re.findall(r"^\s+(\d+) rows:\s+([\d.]+) /\s+([\d.]+)$", out, re.MULTILINE)
    assert [h[0] for h in head] == ["1", "2", "8"]
    assert all(float(v) > 0 for h in head for v in h[1:])
    norms = re.findall(r"^\s+(\d+ × \d+):\s+([\d.]+) /\s+([\d.]+)$", out, re.MULTILINE)
    assert [n[0] for n in norms] == ["1024 × 512", "1024 × 128", "8 × 512", "8 × 128"]
    assert all(float(v) > 0 for n in norms for v in n[1:])
