"""The GPU path as far as a CPU can check it: the kernel tests (run here in a subprocess under
triton's interpreter, see kernels/conftest.py), and the config and errors of the kernel path."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from inference.engine import EngineConfig, LLMEngine

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_kernels_match_their_references_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/inference/engine/kernels", "-q", "-x",
         "-p", "no:cacheprovider"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    passed = re.search(r"(\d+) passed", output)
    assert passed and int(passed.group(1)) >= 50 and "skipped" not in output, output


def test_dtype_and_attention_backend_resolve_by_device():
    cpu = EngineConfig(model="smollm2-tiny-random")
    assert (cpu.dtype, cpu.attention_backend) == ("float32", "torch")
    cuda = EngineConfig(model="smollm2-tiny-random", device="cuda")
    assert (cuda.dtype, cuda.attention_backend) == ("bfloat16", "triton")
    assert EngineConfig(device="cuda:1", dtype="float16", attention_backend="torch").dtype == (
        "float16"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(dtype="bfloat16"), "needs device='cuda'"),
        (dict(dtype="int8"), "dtype must be one of"),
        (dict(attention_backend="flash"), "attention_backend must be one of"),
    ],
)
def test_bad_dtype_or_backend_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model="smollm2-tiny-random", **fields)


def test_kernels_on_cpu_without_the_interpreter_are_refused_at_engine_start():
    # This process has not set TRITON_INTERPRET: the kernels cannot run on CPU tensors here.
    assert os.environ.get("TRITON_INTERPRET") != "1"
    config = EngineConfig(model="smollm2-tiny-random", num_kv_blocks=16, attention_backend="triton")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        LLMEngine(config)
