"""`python -m benchmarks gpu`: refuses clearly without CUDA; on a GPU, the kernel part runs and
passes."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "gpu", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_says_so_and_exits_non_zero():
    result = _run("--quick", timeout=120)
    assert result.returncode == 2
    assert "needs a CUDA GPU" in result.stderr
    assert result.stdout == ""


@pytest.mark.gpu
def test_on_a_gpu_every_kernel_matches_its_reference_at_real_sizes():
    result = _run("--quick", "--skip-engine", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout and "| decode |" in result.stdout
