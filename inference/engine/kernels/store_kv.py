"""store_kv: write a step's keys and values into the paged KV cache by slot mapping.

Token t's K/V rows (n_kv_heads, head_dim) go to slot `slot_mapping[t]` of the layer's cache
(num_slots, n_kv_heads, head_dim); slot -1 marks a padded token (a CUDA-graph batch padded up
to its captured size) and is skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference.engine.kernels._common import (
    INDEX_DTYPES,
    check_cache_pair,
    check_device,
    check_same,
    check_tensor,
    next_pow2,
)


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_cs, stride_ch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + token * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    dst = slot * stride_cs + h[:, None] * stride_ch + d[None, :]
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def store_kv(
    k: torch.Tensor,  # (T, n_kv_heads, head_dim), rows may be strided (a view of fused qkv)
    v: torch.Tensor,
    k_cache: torch.Tensor,  # (num_slots, n_kv_heads, head_dim)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (T,) int32/int64, -1 = skip
) -> None:
    """Slots must be < num_slots and distinct (the runner's block tables guarantee both)."""
    device = k_cache.device
    check_device(device)
    check_cache_pair(k_cache, v_cache, device)
    dtypes = (k_cache.dtype,)
    check_tensor("k", k, ndim=3, dtypes=dtypes, device=device)
    check_tensor("v", v, ndim=3, dtypes=dtypes, device=device)
    check_same("k", tuple(k.shape[1:]), tuple(k_cache.shape[1:]), "(n_kv_heads, head_dim)")
    check_same("v", tuple(v.shape), tuple(k.shape), "shape")
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=INDEX_DTYPES, device=device)
    check_same("slot_mapping", slot_mapping.shape[0], k.shape[0], "length")
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_cache.stride(0), k_cache.stride(1),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_H=next_pow2(num_kv_heads), BLOCK_D=next_pow2(head_dim),
    )  # fmt: skip


def store_kv_reference(k, v, k_cache, v_cache, slot_mapping) -> None:
    """The torch path: index_copy_ of the non-padded rows."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_cache.index_copy_(0, slots, k[keep])
    v_cache.index_copy_(0, slots, v[keep])
