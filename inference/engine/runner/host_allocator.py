"""The host allocator's settings for an engine that computes on the CPU.

glibc's malloc serves a large block (from 128 KB, its threshold then rising with the blocks
freed) by mmap, and returns it to the kernel when freed; freed memory at the top of the heap
goes back too past a trim threshold. Every step of a CPU engine allocates tensors of the same
few sizes, from hundreds of KB to tens of MB (scores, gathered keys, expert rows), so each step
asked the kernel for fresh pages again and touched them page by page: on the tiny V4 a decode
step copied 0.5 MB of expert weights in ~0.7 ms, ~25x the copy's own time (torch.profiler),
and a prefill step's indexer scores (12 MB) took twice their matmul's time. With blocks up to
MMAP_THRESHOLD served from the heap and up to TRIM_THRESHOLD of freed heap kept, the next step
reuses the pages the last one freed: docs/PERFORMANCE.md has the figures.

This is glibc's mallopt, process-wide: the model runner calls it on the CPU (every rank), where
the C library is glibc (on another libc nothing changes and the start says so).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 32 << 20  # glibc's largest on 64-bit: blocks up to it come from the heap
TRIM_THRESHOLD = 256 << 20  # freed heap kept for the next step before it goes back to the kernel


def keep_freed_memory() -> str:
    """Set glibc's thresholds (once per process is enough; again is harmless) and say what was
    set, for the engine's start log."""
    libc = _glibc()
    if libc is None:
        return "host allocator: not glibc, its defaults kept"
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    if not ok:
        return "host allocator: glibc refused the thresholds, its defaults kept"
    return (
        f"host allocator: blocks up to {MMAP_THRESHOLD >> 20} MB from the heap, up to "
        f"{TRIM_THRESHOLD >> 20} MB of freed memory kept for reuse"
    )


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 — present only in glibc
    except (OSError, AttributeError):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc
