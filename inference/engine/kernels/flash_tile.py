"""One key tile of paged flash attention, as the decode and prefill kernels both read it: the
tile's K/V through the block table and its scores, then the online-softmax update of each query
row's running max `m`, sum `l` and output `acc` (flash attention: what came before is rescaled
by exp2(m_old - m_new), so one pass over the keys gives the softmax-weighted sum). Each kernel
masks the scores itself (decode: the partition's end; prefill: causal and window too).

Scores are in log2 units (the caller's scale includes log2(e)), hence exp2.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def first_block(first_blocks_ptr, seq, HAS_FIRST: tl.constexpr):
    """The block index of block_tables[seq, 0]: 0 unless the tables start later (HAS_FIRST)."""
    first = 0
    if HAS_FIRST:
        first = tl.load(first_blocks_ptr + seq)
    return first


@triton.jit
def load_kv_tile(
    k_cache_ptr, v_cache_ptr, block_tables_ptr, seq, first, kv_head, pos, pos_mask, d,
    stride_cs, stride_ch, stride_bt,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """The keys and values at positions `pos` of sequence `seq` (zeros where not `pos_mask`);
    `first` is the block index of the sequence's first block-table entry."""
    table = block_tables_ptr + seq * stride_bt + pos // BLOCK_SIZE - first
    slot = tl.load(table, mask=pos_mask).to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
    kv_offsets = slot[:, None] * stride_cs + kv_head * stride_ch + d[None, :]
    kv_mask = pos_mask[:, None] & (d < HEAD_DIM)[None, :]
    k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)  # (BLOCK_N, BLOCK_D)
    v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@triton.jit
def score_kv_tile(
    q, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq, first, kv_head, tile, end, d, scale_log2,
    stride_cs, stride_ch, stride_bt,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """The BLOCK_N keys from position `tile` (those before `end`): their positions `pos`, the mask
    pos < end, the scores of the query rows `q` against them (log2 units, not yet masked:
    (rows, BLOCK_N)) and their values (BLOCK_N, BLOCK_D)."""
    pos = tile + tl.arange(0, BLOCK_N)
    pos_mask = pos < end
    k, v = load_kv_tile(
        k_cache_ptr, v_cache_ptr, block_tables_ptr, seq, first, kv_head, pos, pos_mask, d,
        stride_cs, stride_ch, stride_bt, HEAD_DIM, BLOCK_SIZE, UPCAST,
    )  # fmt: skip
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
    return pos, pos_mask, s, v


@triton.jit
def start_online_softmax(ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """The running (m_i, l_i, acc) of ROWS query rows before any key: -inf, 0, 0."""
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    return m_i, l_i, acc


@triton.jit
def online_softmax_update(s, v, m_i, l_i, acc, PRECISION: tl.constexpr):
    """Fold one tile's scores `s` (rows, BLOCK_N; -inf where a key is not visible) and values
    `v` (BLOCK_N, BLOCK_D) into the running (m_i, l_i, acc); returns the new three."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row may see no key in a tile (causal or window): keep its max finite for exp2.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc
