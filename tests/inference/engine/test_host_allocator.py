"""The CPU engine's host allocator settings: a step's tensors of up to 32 MB come from the heap
(reused from the last step's) instead of fresh pages the kernel maps and then takes back."""

import subprocess
import sys

import pytest

from inference.engine.runner.host_allocator import _glibc

# In a fresh process: the bytes glibc holds in mmapped blocks while a 24 MB tensor is alive,
# with the engine's settings or without (glibc's threshold starts at 128 KB and rises only
# with the mmapped blocks freed, none that large yet).
PROBE = """
import ctypes, sys, torch
from inference.engine.runner.host_allocator import keep_freed_memory
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
if sys.argv[1] == "engine":
    print(keep_freed_memory(), file=sys.stderr)
before = libc.mallinfo2().hblkhd
x = torch.ones(6 << 20)  # 24 MB
print(libc.mallinfo2().hblkhd - before)
"""


def _mmapped_growth(mode: str) -> int:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(result.stdout.strip())


@pytest.mark.skipif(_glibc() is None, reason="the settings are glibc's")
def test_a_step_sized_tensor_comes_from_the_heap_with_the_engines_settings():
    assert _mmapped_growth("default") >= 24 << 20  # glibc's default: fresh pages
    assert _mmapped_growth("engine") == 0
