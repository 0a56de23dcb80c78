"""Paged attention for prefill with a cached prefix: a sequence's new tokens (the last
query_len of its seq_len positions) attend to every earlier key in the cache and, causally, to
each other. This step's K/V are stored in the cache first, so all keys are read through the
block table alike.

Program (sequence, kv head, query tile): GQA folds the kv head's query group into the rows of
one tile (row r = token r // GROUP, head r % GROUP), so K/V are read once per group. Keys run
from the tile's earliest visible position (0, or the window's start) to its last query.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference.engine.kernels._common import (
    dot_precision,
    next_pow2,
    upcast_dot,
)
from inference.engine.kernels.decode_attention import (
    LOG2E,
    NO_WINDOW,
    attention_out,
    check_attention_inputs,
    check_per_sequence,
)
from inference.engine.kernels.flash_tile import (
    first_block,
    online_softmax_update,
    score_kv_tile,
    start_online_softmax,
)
from inference.engine.kernels.reference import paged_attention_reference

BLOCK_M = 64  # query rows (tokens × group heads) per tile
BLOCK_N = 64  # keys per tile


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    block_tables_ptr, seq_lens_ptr, query_starts_ptr, query_lens_ptr, first_blocks_ptr,
    scale_log2, window,
    stride_qt, stride_qh, stride_cs, stride_ch, stride_ot, stride_oh, stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_FIRST: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_tile = tl.program_id(2)
    first = first_block(first_blocks_ptr, seq, HAS_FIRST)
    query_len = tl.load(query_lens_ptr + seq)
    if q_tile * BLOCK_Q >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    query_start = tl.load(query_starts_ptr + seq).to(tl.int64)
    r = tl.arange(0, BLOCK_M)
    token = q_tile * BLOCK_Q + r // GROUP  # within this sequence's queries
    head = kv_head * GROUP + r % GROUP
    d = tl.arange(0, BLOCK_D)
    row_valid = (r < BLOCK_Q * GROUP) & (token < query_len)
    row_mask = row_valid[:, None] & (d < HEAD_DIM)[None, :]
    q_pos = seq_len - query_len + token  # absolute position of each row's query
    q_offsets = (query_start + token)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_offsets, mask=row_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    first_pos = seq_len - query_len + q_tile * BLOCK_Q
    key_end = tl.minimum(first_pos + BLOCK_Q, seq_len)  # one past the tile's last query
    key_start = tl.maximum(first_pos - window + 1, 0)
    m_i, l_i, acc = start_online_softmax(BLOCK_M, BLOCK_D)
    for tile in range(key_start, key_end, BLOCK_N):
        pos, pos_mask, s, v = score_kv_tile(
            q, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq, first, kv_head, tile, key_end, d,
            scale_log2, stride_cs, stride_ch, stride_bt,
            HEAD_DIM, BLOCK_SIZE, BLOCK_N, UPCAST, PRECISION,
        )  # fmt: skip
        # (BLOCK_M, BLOCK_N): a row sees the keys up to its own position, within the window
        visible = pos_mask[None, :] & (pos[None, :] <= q_pos[:, None])
        visible = visible & (pos[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_i, l_i, acc = online_softmax_update(s, v, m_i, l_i, acc, PRECISION)
    l_i = tl.where(l_i == 0.0, 1.0, l_i)  # padding rows only: every query sees itself
    out_offsets = (query_start + token)[:, None] * stride_ot + head[:, None] * stride_oh
    tl.store(out_ptr + out_offsets + d[None, :], acc / l_i[:, None], mask=row_mask)


def prefill_attention(
    q: torch.Tensor,  # (T, n_heads, head_dim)
    k_cache: torch.Tensor,  # (num_slots, n_kv_heads, head_dim), this step's K/V already stored
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (B, max_blocks) int32/int64
    seq_lens: torch.Tensor,  # (B,) context length, this step's tokens included
    query_starts: torch.Tensor,  # (B,) first row of sequence b's queries in q (and out)
    query_lens: torch.Tensor,  # (B,) its new tokens: positions seq_len - query_len ... seq_len - 1
    block_size: int,
    scale: float,
    *,
    max_query_len: int,  # an upper bound on query_lens: it sizes the grid
    window: int | None = None,  # a query at p sees keys in (p - window, p]
    out: torch.Tensor | None = None,  # rows of other sequences are left untouched
    first_blocks: torch.Tensor | None = None,  # as in decode_attention
) -> torch.Tensor:
    device = q.device
    num_seqs, num_heads, num_kv_heads, head_dim = check_attention_inputs(
        q, k_cache, v_cache, block_tables, seq_lens, block_size, window
    )
    check_per_sequence(
        ("query_starts", query_starts), ("query_lens", query_lens),
        ("first_blocks", first_blocks), n=num_seqs, device=device,
    )  # fmt: skip
    if max_query_len < 1:
        raise ValueError(f"max_query_len must be ≥ 1, got {max_query_len}")
    out = attention_out(q, out)
    if num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    block_m = max(BLOCK_M, next_pow2(group))
    block_q = block_m // group
    _prefill_kernel[(num_seqs, num_kv_heads, -(-max_query_len // block_q))](
        q, k_cache, v_cache, out, block_tables, seq_lens, query_starts, query_lens,
        seq_lens if first_blocks is None else first_blocks, scale * LOG2E, window or NO_WINDOW,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        out.stride(0), out.stride(1), block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_D=max(16, next_pow2(head_dim)), BLOCK_N=BLOCK_N,
        HAS_FIRST=first_blocks is not None,
        UPCAST=upcast_dot(q.dtype, device), PRECISION=dot_precision(q.dtype),
        num_warps=4, num_stages=2,
    )  # fmt: skip
    return out


def prefill_attention_reference(
    q, k_cache, v_cache, block_tables, seq_lens, query_starts, query_lens, block_size, scale,
    *, window=None, first_blocks=None,
) -> torch.Tensor:  # fmt: skip
    return paged_attention_reference(
        q, k_cache, v_cache, block_tables, seq_lens, query_starts, query_lens, block_size,
        scale, window, first_blocks,
    )  # fmt: skip
