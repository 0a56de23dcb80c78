"""Paged attention for decode: one query token per sequence, K/V read through block tables.

Split-K (flash-decoding): a sequence's visible keys are cut into partitions of
`partition_size` tokens; program (sequence, kv head, partition) attends the kv head's query
group (GQA: the group's heads are the rows of one tl.dot) to its partition, and a second
kernel merges the partitions by log-sum-exp. Many programs per sequence is what lets a few
long sequences fill the GPU. With one partition the first kernel writes the output directly.
The grid is fixed by `max_seq_len`, not by the lengths in the batch, so a CUDA graph captured
with a bound replays for any lengths up to it: partitions past a sequence's end exit at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference.engine.kernels._common import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_cache_pair,
    check_device,
    check_same,
    check_tensor,
    dot_precision,
    next_pow2,
    upcast_dot,
)
from inference.engine.kernels.flash_tile import (
    first_block,
    online_softmax_update,
    score_kv_tile,
    start_online_softmax,
)
from inference.engine.kernels.reference import paged_attention_reference

LOG2E = 1.4426950408889634
BLOCK_N = 64  # keys per tile
# "No window" is a window longer than any sequence: the kernels then need no branch on it.
NO_WINDOW = 1 << 30
MAX_HEAD_DIM = 256


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    block_tables_ptr, seq_lens_ptr, query_rows_ptr, first_blocks_ptr,
    scale_log2, window, num_parts,
    stride_qt, stride_qh, stride_cs, stride_ch, stride_ot, stride_oh, stride_bt,
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    PARTITION: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_FIRST: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    first = first_block(first_blocks_ptr, seq, HAS_FIRST)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = tl.maximum(seq_len - window, 0)  # first visible key
    part_start = start + part * PARTITION
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    head = kv_head * GROUP + g
    row_mask = (g < GROUP)[:, None] & (d < HEAD_DIM)[None, :]
    row = tl.load(query_rows_ptr + seq).to(tl.int64)
    out_ptrs = out_ptr + row * stride_ot + head[:, None] * stride_oh + d[None, :]
    if part_start >= seq_len:
        if not SPLIT:  # a padded sequence (length 0): a defined output, never garbage
            tl.store(out_ptrs, tl.zeros([BLOCK_G, BLOCK_D], tl.float32), mask=row_mask)
        return
    part_end = tl.minimum(part_start + PARTITION, seq_len)

    q = tl.load(q_ptr + row * stride_qt + head[:, None] * stride_qh + d[None, :], mask=row_mask)
    if UPCAST:
        q = q.to(tl.float32)
    m_i, l_i, acc = start_online_softmax(BLOCK_G, BLOCK_D)
    for tile in range(part_start, part_end, BLOCK_N):
        _, pos_mask, s, v = score_kv_tile(
            q, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq, first, kv_head, tile, part_end, d,
            scale_log2, stride_cs, stride_ch, stride_bt,
            HEAD_DIM, BLOCK_SIZE, BLOCK_N, UPCAST, PRECISION,
        )  # fmt: skip
        s = tl.where(pos_mask[None, :], s, float("-inf"))  # (BLOCK_G, BLOCK_N)
        m_i, l_i, acc = online_softmax_update(s, v, m_i, l_i, acc, PRECISION)
    acc = acc / l_i[:, None]
    if SPLIT:
        index = (seq * NUM_HEADS + head) * num_parts + part  # into (B, H, num_parts)
        tl.store(part_out_ptr + index[:, None] * HEAD_DIM + d[None, :], acc, mask=row_mask)
        tl.store(part_lse_ptr + index, m_i + tl.log2(l_i), mask=g < GROUP)
    else:
        tl.store(out_ptrs, acc, mask=row_mask)


@triton.jit
def _merge_kernel(
    out_ptr, part_out_ptr, part_lse_ptr, seq_lens_ptr, query_rows_ptr,
    window, num_parts, stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PARTITION: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    num_keys = tl.minimum(seq_len, window)
    used = tl.cdiv(num_keys, PARTITION)  # partitions this sequence wrote
    row = tl.load(query_rows_ptr + seq).to(tl.int64)
    p = tl.arange(0, BLOCK_P)
    d = tl.arange(0, BLOCK_D)
    out_ptrs = out_ptr + row * stride_ot + head * stride_oh + d
    if used == 0:  # a padded sequence
        tl.store(out_ptrs, tl.zeros([BLOCK_D], tl.float32), mask=d < HEAD_DIM)
        return
    index = (seq * NUM_HEADS + head) * num_parts + p
    lse = tl.load(part_lse_ptr + index, mask=p < used, other=float("-inf"))
    weight = tl.exp2(lse - tl.max(lse, 0))
    weight = weight / tl.sum(weight, 0)
    mask = (p < used)[:, None] & (d < HEAD_DIM)[None, :]
    parts = tl.load(part_out_ptr + index[:, None] * HEAD_DIM + d[None, :], mask=mask, other=0.0)
    tl.store(out_ptrs, tl.sum(parts * weight[:, None], 0), mask=d < HEAD_DIM)


def decode_attention(
    q: torch.Tensor,  # (T, n_heads, head_dim)
    k_cache: torch.Tensor,  # (num_slots, n_kv_heads, head_dim), this step's K/V already stored
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (B, max_blocks) int32/int64
    seq_lens: torch.Tensor,  # (B,) context length including the query token; 0 = padding
    query_rows: torch.Tensor,  # (B,) the row of q (and of out) that is sequence b's query
    block_size: int,
    scale: float,
    *,
    max_seq_len: int,  # an upper bound on seq_lens: it sizes the grid
    window: int | None = None,  # a query at p sees keys in (p - window, p]
    out: torch.Tensor | None = None,  # (T, n_heads, head_dim); rows not in query_rows untouched
    partition_size: int = 512,
    # (B,): block_tables[b, 0] is the block of positions first_blocks[b] * block_size on (a
    # sliding layer's table lists only the window's blocks); None: every table starts at 0.
    first_blocks: torch.Tensor | None = None,
) -> torch.Tensor:
    device = q.device
    num_seqs, num_heads, num_kv_heads, head_dim = check_attention_inputs(
        q, k_cache, v_cache, block_tables, seq_lens, block_size, window
    )
    check_per_sequence(
        ("query_rows", query_rows), ("first_blocks", first_blocks), n=num_seqs, device=device
    )
    capacity = block_tables.shape[1] * block_size if first_blocks is None else 1 << 30
    if not 1 <= max_seq_len <= capacity:
        raise ValueError(
            f"max_seq_len ({max_seq_len}) must be in [1, max_blocks * block_size = "
            f"{block_tables.shape[1] * block_size}]"
        )
    if partition_size < 16 or partition_size & (partition_size - 1):
        raise ValueError(f"partition_size must be a power of two ≥ 16, got {partition_size}")
    out = attention_out(q, out)
    if num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    block_n = min(BLOCK_N, partition_size)
    num_keys = max_seq_len if window is None else min(max_seq_len, window)
    num_parts = -(-num_keys // partition_size)
    split = num_parts > 1
    if split:
        part_out = torch.empty(num_seqs, num_heads, num_parts, head_dim, device=device)
        part_lse = torch.empty(num_seqs, num_heads, num_parts, device=device)
    else:
        part_out = part_lse = out  # unused
    _decode_kernel[(num_seqs, num_kv_heads, num_parts)](
        q, k_cache, v_cache, out, part_out, part_lse, block_tables, seq_lens, query_rows,
        seq_lens if first_blocks is None else first_blocks,
        scale * LOG2E, window or NO_WINDOW, num_parts,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        out.stride(0), out.stride(1), block_tables.stride(0),
        NUM_HEADS=num_heads, GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        PARTITION=partition_size, SPLIT=split, HAS_FIRST=first_blocks is not None,
        BLOCK_G=max(16, next_pow2(group)), BLOCK_D=max(16, next_pow2(head_dim)), BLOCK_N=block_n,
        UPCAST=upcast_dot(q.dtype, device), PRECISION=dot_precision(q.dtype),
        num_warps=4, num_stages=2,
    )  # fmt: skip
    if split:
        _merge_kernel[(num_seqs, num_heads)](
            out, part_out, part_lse, seq_lens, query_rows, window or NO_WINDOW, num_parts,
            out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, PARTITION=partition_size,
            BLOCK_P=next_pow2(num_parts), BLOCK_D=next_pow2(head_dim), num_warps=4,
        )  # fmt: skip
    return out


def check_attention_inputs(
    q, k_cache, v_cache, block_tables, seq_lens, block_size, window
) -> tuple[int, int, int, int]:
    """The checks both attention launchers share; returns (B, n_heads, n_kv_heads, head_dim)."""
    device = q.device
    check_device(device)
    check_cache_pair(k_cache, v_cache, device)
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES, device=device)
    check_same("q", q.dtype, k_cache.dtype, "dtype (must match the cache)")
    num_slots, num_kv_heads, head_dim = k_cache.shape
    num_heads = q.shape[1]
    check_same("q", q.shape[2], head_dim, "head_dim")
    if num_heads % num_kv_heads:
        raise ValueError(f"n_heads ({num_heads}) must be a multiple of n_kv_heads ({num_kv_heads})")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}")
    check_tensor("block_tables", block_tables, ndim=2, dtypes=INDEX_DTYPES, device=device)
    num_seqs = block_tables.shape[0]
    check_tensor("seq_lens", seq_lens, ndim=1, dtypes=INDEX_DTYPES, device=device)
    check_same("seq_lens", seq_lens.shape[0], num_seqs, "length (one per block_tables row)")
    if block_size < 1 or block_size & (block_size - 1) or num_slots % block_size:
        raise ValueError(
            f"block_size must be a power of two dividing num_slots ({num_slots}), got {block_size}"
        )
    if window is not None and not 1 <= window < NO_WINDOW:
        raise ValueError(f"window must be None or in [1, {NO_WINDOW}), got {window}")
    return num_seqs, num_heads, num_kv_heads, head_dim


def attention_out(q: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The launchers' output: `out` checked to be q's shape and dtype, or a new tensor like q."""
    if out is None:
        return torch.empty_like(q)
    check_tensor("out", out, ndim=3, dtypes=(q.dtype,), device=q.device)
    check_same("out", tuple(out.shape), tuple(q.shape), "shape")
    return out


def check_per_sequence(
    *named: tuple[str, torch.Tensor | None], n: int, device: torch.device
) -> None:
    """1-D index tensors with one entry per sequence (None: an optional one left out)."""
    for name, t in named:
        if t is not None:
            check_tensor(name, t, ndim=1, dtypes=INDEX_DTYPES, device=device)
            check_same(name, t.shape[0], n, "length (one per block_tables row)")


def decode_attention_reference(
    q, k_cache, v_cache, block_tables, seq_lens, query_rows, block_size, scale, *, window=None,
    first_blocks=None,
) -> torch.Tensor:  # fmt: skip
    """Rows of q not named in query_rows come back as zeros."""
    return paged_attention_reference(
        q, k_cache, v_cache, block_tables, seq_lens, query_rows,
        torch.ones_like(seq_lens), block_size, scale, window, first_blocks,
    )  # fmt: skip
