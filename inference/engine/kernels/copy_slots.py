"""Copying KV slots inside the cache, for every layer at once: the copy-on-write of a partly
filled block (its first n slots into a fresh block) and the sliding-window checkpoints (the
window's slots into checkpoint blocks, and back).

The cache is one stacked tensor (num_caches, num_slots, n_kv_heads, head_dim): the K and V of
every layer of one KV group (the runner keeps each group's layers consecutive so that this is a
view). `copy_slots` copies row src[i] to row dst[i] in all of them. Two implementations: a
triton kernel (one launch; program (pair, cache) copies one n_kv_heads × head_dim row) and
batched torch ops (index_select, then index_copy_: two launches and a temporary). Both move the
same bytes once; at CoW sizes (≤ block_size slots × 2 × num_layers rows) each costs a few
microseconds of launches, and the kernel saves one launch and the temporary's round trip.
`benchmarks/gpu.py` times both; the engine uses the kernel on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference.engine.kernels._common import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_device,
    check_same,
    check_tensor,
    next_pow2,
)
from inference.engine.kernels.reference import copy_slots_reference


@triton.jit
def _copy_slots_kernel(
    cache_ptr, src_ptr, dst_ptr, stride_c, stride_s,
    ROW: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pair = tl.program_id(0)
    cache = tl.program_id(1).to(tl.int64)
    src = tl.load(src_ptr + pair).to(tl.int64)
    dst = tl.load(dst_ptr + pair).to(tl.int64)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < ROW
    base = cache_ptr + cache * stride_c
    row = tl.load(base + src * stride_s + offsets, mask=mask)
    tl.store(base + dst * stride_s + offsets, row, mask=mask)


def copy_slots(
    cache: torch.Tensor,  # (num_caches, num_slots, n_kv_heads, head_dim)
    src_slots: torch.Tensor,  # (N,) int32/int64
    dst_slots: torch.Tensor,  # (N,) distinct, none of them in src_slots
    *,
    use_kernel: bool | None = None,  # default: the kernel on CUDA, torch ops elsewhere
) -> None:
    device = cache.device
    check_tensor("cache", cache, ndim=4, dtypes=FLOAT_DTYPES)
    if cache.stride(2) != cache.shape[3]:
        raise ValueError(f"cache rows (n_kv_heads, head_dim) must be contiguous: {cache.stride()}")
    for name, t in (("src_slots", src_slots), ("dst_slots", dst_slots)):
        check_tensor(name, t, ndim=1, dtypes=INDEX_DTYPES, device=device)
    check_same("dst_slots", dst_slots.shape[0], src_slots.shape[0], "length")
    if src_slots.shape[0] == 0:
        return
    if use_kernel is None:
        use_kernel = device.type == "cuda"
    if not use_kernel:
        copy_slots_reference(cache, src_slots, dst_slots)
        return
    check_device(device)
    row = cache.shape[2] * cache.shape[3]
    _copy_slots_kernel[(src_slots.shape[0], cache.shape[0])](
        cache, src_slots, dst_slots, cache.stride(0), cache.stride(1),
        ROW=row, BLOCK=next_pow2(row), num_warps=4 if row >= 512 else 2,
    )  # fmt: skip


def cow_slots(
    copies: list[tuple[int, int, int]], block_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(src_block, dst_block, n) copies of a block's first n slots → (src_slots, dst_slots)."""
    src, dst = [], []
    for src_block, dst_block, n in copies:
        if not 0 <= n <= block_size:
            raise ValueError(f"a block holds {block_size} slots; cannot copy {n}")
        src += range(src_block * block_size, src_block * block_size + n)
        dst += range(dst_block * block_size, dst_block * block_size + n)
    return _tensors(src, dst, device)


def checkpoint_slots(
    live_slots: list[int], checkpoint_blocks: list[int], block_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Save: the live slots (a window's positions, in order) → the checkpoint blocks' slots, in
    order. Swap the pair to restore."""
    capacity = len(checkpoint_blocks) * block_size
    if len(live_slots) > capacity:
        raise ValueError(
            f"{len(live_slots)} slots do not fit in {len(checkpoint_blocks)} checkpoint blocks "
            f"of {block_size}"
        )
    dst = [b * block_size + i for b in checkpoint_blocks for i in range(block_size)]
    return _tensors(list(live_slots), dst[: len(live_slots)], device)


def _tensors(src: list[int], dst: list[int], device: torch.device):
    return (
        torch.tensor(src, dtype=torch.int64, device=device),
        torch.tensor(dst, dtype=torch.int64, device=device),
    )
