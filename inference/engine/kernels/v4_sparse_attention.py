"""DeepSeek-V4's attention as one triton kernel: each query over the pool rows it reads.

A V4 query reads up to three parts, each a pool of rows (num_rows, head_dim) and a table of
row ids (Q, K) padded with -1: the sliding window's K=V slots and the compressed entries it
sees (HCA's by causality, CSA's picked by the indexer). A row is both key and value (K = V),
and one shared KV head serves every query head. Each head has a sink: a logit with no value
that only adds to the softmax's denominator.

Program (query, head block, split) loads BLOCK_H heads of its query (the rows of one tl.dot),
walks its share of each part's row ids a tile at a time, loads the rows straight from the pool
(no gathered copy; -1 ids are masked and skipped), and folds them into an online softmax
(flash_tile.online_softmax_update) that starts from the sinks: the sink is a key of logit
`sink` and value 0, so m starts at the sink and l at 1. With one split it writes the output;
with several (split-K, for the few programs of a small decode batch on a large GPU) each split
takes a tile-aligned slice of every part, split 0 alone carries the sinks, and a second kernel
merges the splits by log-sum-exp. The torch reference (V4's CPU path) is
reference.sparse_attention_reference.
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
    dot_precision,
    next_pow2,
    upcast_dot,
)
from inference.engine.kernels.decode_attention import LOG2E
from inference.engine.kernels.flash_tile import online_softmax_update
from inference.engine.kernels.reference import sparse_attention_reference

__all__ = ["sparse_attention", "sparse_attention_reference"]

BLOCK_H = 16  # query heads per program: tl.dot's smallest M on tensor cores
MAX_PARTS = 3
MAX_SPLITS = 16
_LOG2E_IN_KERNEL = tl.constexpr(LOG2E)  # a global a @triton.jit function may read


@triton.jit
def _attend_part(
    q, pool_ptr, rows_ptr, stride_pool, stride_rows, query, lo, hi, scale_log2, m_i, l_i, acc, d,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Fold row ids [lo, hi) of one part's table (row `query`) into (m_i, l_i, acc)."""
    for tile in range(lo, hi, BLOCK_N):
        k_index = tile + tl.arange(0, BLOCK_N)
        ids = tl.load(rows_ptr + query * stride_rows + k_index, mask=k_index < hi, other=-1)
        live = ids >= 0
        offsets = ids.to(tl.int64)[:, None] * stride_pool + d[None, :]
        kv = tl.load(pool_ptr + offsets, mask=live[:, None] & (d < HEAD_DIM)[None, :], other=0.0)
        if UPCAST:
            kv = kv.to(tl.float32)
        s = tl.dot(q, tl.trans(kv), input_precision=PRECISION) * scale_log2  # (BLOCK_H, BLOCK_N)
        s = tl.where(live[None, :], s, float("-inf"))
        m_i, l_i, acc = online_softmax_update(s, kv, m_i, l_i, acc, PRECISION)
    return m_i, l_i, acc


@triton.jit
def _sparse_attention_kernel(
    q_ptr, sinks_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    pool0_ptr, rows0_ptr, pool1_ptr, rows1_ptr, pool2_ptr, rows2_ptr,
    width0, width1, width2, chunk0, chunk1, chunk2,
    stride_p0, stride_r0, stride_p1, stride_r1, stride_p2, stride_r2,
    scale_log2, num_heads, num_splits, stride_qt, stride_qh, stride_ot, stride_oh,
    NUM_PARTS: tl.constexpr, SPLIT: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    query = tl.program_id(0).to(tl.int64)
    split = tl.program_id(2)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    h_mask = h < num_heads
    mask = h_mask[:, None] & (d < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + query * stride_qt + h[:, None] * stride_qh + d[None, :], mask=mask,
                other=0.0)  # fmt: skip
    if UPCAST:
        q = q.to(tl.float32)
    sink = tl.load(sinks_ptr + h, mask=h_mask, other=0.0).to(tl.float32) * _LOG2E_IN_KERNEL
    first = split == 0  # the sinks are counted once, in split 0
    m_i = tl.where(first, sink, float("-inf"))
    l_i = tl.where(first, tl.full([BLOCK_H], 1.0, tl.float32), tl.zeros([BLOCK_H], tl.float32))
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    m_i, l_i, acc = _attend_part(
        q, pool0_ptr, rows0_ptr, stride_p0, stride_r0, query,
        split * chunk0, tl.minimum((split + 1) * chunk0, width0), scale_log2, m_i, l_i, acc, d,
        HEAD_DIM, BLOCK_N, UPCAST, PRECISION,
    )  # fmt: skip
    if NUM_PARTS > 1:
        m_i, l_i, acc = _attend_part(
            q, pool1_ptr, rows1_ptr, stride_p1, stride_r1, query,
            split * chunk1, tl.minimum((split + 1) * chunk1, width1), scale_log2, m_i, l_i, acc,
            d, HEAD_DIM, BLOCK_N, UPCAST, PRECISION,
        )  # fmt: skip
    if NUM_PARTS > 2:
        m_i, l_i, acc = _attend_part(
            q, pool2_ptr, rows2_ptr, stride_p2, stride_r2, query,
            split * chunk2, tl.minimum((split + 1) * chunk2, width2), scale_log2, m_i, l_i, acc,
            d, HEAD_DIM, BLOCK_N, UPCAST, PRECISION,
        )  # fmt: skip
    # l_i is 0 only in a later split that met no live row (its m_i is still -inf).
    l_i = tl.where(l_i == 0.0, 1.0, l_i)
    if SPLIT:
        index = (query * num_heads + h) * num_splits + split  # into (Q, H, num_splits)
        tl.store(part_out_ptr + index[:, None] * HEAD_DIM + d[None, :], acc / l_i[:, None],
                 mask=mask)  # fmt: skip
        tl.store(part_lse_ptr + index, m_i + tl.log2(l_i), mask=h_mask)
    else:
        out_ptrs = out_ptr + query * stride_ot + h[:, None] * stride_oh + d[None, :]
        tl.store(out_ptrs, acc / l_i[:, None], mask=mask)


@triton.jit
def _merge_splits_kernel(
    out_ptr, part_out_ptr, part_lse_ptr, num_heads, num_splits, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    query = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    index = (query * num_heads + head) * num_splits + s
    lse = tl.load(part_lse_ptr + index, mask=s < num_splits, other=float("-inf"))
    weight = tl.exp2(lse - tl.max(lse, 0))  # split 0's lse is finite: it holds the sink
    weight = weight / tl.sum(weight, 0)
    mask = (s < num_splits)[:, None] & (d < HEAD_DIM)[None, :]
    parts = tl.load(part_out_ptr + index[:, None] * HEAD_DIM + d[None, :], mask=mask, other=0.0)
    out_ptrs = out_ptr + query * stride_ot + head * stride_oh + d
    tl.store(out_ptrs, tl.sum(parts * weight[:, None], 0), mask=d < HEAD_DIM)


def sparse_attention(
    q: torch.Tensor,  # (Q, H, D)
    parts: list[tuple[torch.Tensor, torch.Tensor]],  # (pool (N, D), rows (Q, K) -1 padded)
    sinks: torch.Tensor,  # (H,)
    scale: float,
    *,
    num_splits: int | None = None,  # default: split-K only on CUDA when programs are few
) -> torch.Tensor:
    """(Q, H, D) in q's dtype, as sparse_attention_reference. The row ids are not
    bounds-checked (that would cost a device sync): each must be -1 or a row of its pool."""
    device = q.device
    check_device(device)
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    num_queries, num_heads, head_dim = q.shape
    check_tensor("sinks", sinks, ndim=1, dtypes=FLOAT_DTYPES, device=device)
    check_same("sinks", sinks.shape[0], num_heads, "length (one sink per head)")
    if not 1 <= len(parts) <= MAX_PARTS:
        raise ValueError(f"parts: 1 to {MAX_PARTS} (pool, rows) pairs, got {len(parts)}")
    for i, (pool, rows) in enumerate(parts):
        check_tensor(f"parts[{i}] pool", pool, ndim=2, dtypes=(q.dtype,), device=device)
        check_same(f"parts[{i}] pool", pool.shape[1], head_dim, "row width (q's head_dim)")
        check_tensor(f"parts[{i}] rows", rows, ndim=2, dtypes=INDEX_DTYPES, device=device)
        check_same(f"parts[{i}] rows", rows.shape[0], num_queries, "number of queries")
    out = torch.empty_like(q)
    parts = [(pool, rows) for pool, rows in parts if rows.shape[1] > 0]
    if num_queries == 0 or num_heads == 0:
        return out
    if not parts:  # no query reads a row: the sinks take the whole softmax
        return out.zero_()
    block_d = max(16, next_pow2(head_dim))
    block_n = 32 if block_d >= 512 else 64
    head_blocks = -(-num_heads // BLOCK_H)
    widths = [rows.shape[1] for _, rows in parts]
    if num_splits is None:
        num_sms = 0
        if device.type == "cuda":
            num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        num_splits = default_num_splits(num_queries * head_blocks, max(widths), block_n, num_sms)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in 1..{MAX_SPLITS}, got {num_splits}")
    # Each split takes a tile-aligned slice of every part: split s reads [s·c, (s+1)·c).
    chunks = [-(-w // (num_splits * block_n)) * block_n for w in widths]
    padded = parts + [parts[0]] * (MAX_PARTS - len(parts))  # unused: NUM_PARTS skips them
    widths += [0] * (MAX_PARTS - len(widths))
    chunks += [0] * (MAX_PARTS - len(chunks))
    split = num_splits > 1
    part_out = part_lse = out  # unused without split
    if split:
        part_out = torch.empty(num_queries, num_heads, num_splits, head_dim, device=device)
        part_lse = torch.empty(num_queries, num_heads, num_splits, device=device)
    strides = [s for pool, rows in padded for s in (pool.stride(0), rows.stride(0))]
    _sparse_attention_kernel[(num_queries, head_blocks, num_splits)](
        q, sinks, out, part_out, part_lse,
        *[t for pair in padded for t in pair], *widths, *chunks, *strides,
        scale * LOG2E, num_heads, num_splits, q.stride(0), q.stride(1),
        out.stride(0), out.stride(1),
        NUM_PARTS=len(parts), SPLIT=split, HEAD_DIM=head_dim, BLOCK_H=BLOCK_H, BLOCK_D=block_d,
        BLOCK_N=block_n, UPCAST=upcast_dot(q.dtype, device), PRECISION=dot_precision(q.dtype),
        num_warps=8 if block_d >= 256 else 4, num_stages=2,
    )  # fmt: skip
    if split:
        _merge_splits_kernel[(num_queries, num_heads)](
            out, part_out, part_lse, num_heads, num_splits, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_S=max(2, next_pow2(num_splits)), BLOCK_D=block_d,
        )  # fmt: skip
    return out


def default_num_splits(num_programs: int, width: int, block_n: int, num_sms: int) -> int:
    """Split-K where the (query, head block) programs cannot fill the GPU (twice its SMs;
    num_sms 0 off CUDA): enough splits to do so, none shorter than a tile of the widest part."""
    if num_sms == 0:
        return 1
    wanted = -(-2 * num_sms // num_programs)
    return max(1, min(wanted, -(-width // block_n), MAX_SPLITS))
