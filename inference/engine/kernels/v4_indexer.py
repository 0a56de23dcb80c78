"""DeepSeek-V4's lightning indexer scores: for each query t and each pool row it may see,
∑_h w[t, h] · scale · ReLU(q[t, h] · K[row]) (CSA keeps the top-k rows per query).

Program (query, tile of BLOCK_E visible entries) gathers the tile's keys through the query's
row of `visible` (-1 = padding: scored -inf, never read) and takes all heads against them in one
tl.dot, (heads, D) × (D, BLOCK_E); a tile with no visible entry stores -inf without a load.
A query's visible rows are a prefix of its row, so its trailing tiles are such tiles.

The top-k itself stays torch.topk over these scores (models/deepseek_v4/attention.py's
Indexer.select, for the kernel's scores and the reference's alike): a fused top-k would need a
selection across tiles (radix or bitonic over E); the scores are (Q, E) fp32, small beside the
keys the kernel reads.
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

BLOCK_E = 64  # entries per tile
MAX_HEADS, MAX_HEAD_DIM = 128, 256


@triton.jit
def _indexer_scores_kernel(
    q_ptr, weights_ptr, keys_ptr, visible_ptr, out_ptr,
    num_entries, scale,
    stride_qt, stride_qh, stride_wt, stride_ks, stride_vt, stride_ot,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    in_row = e < num_entries
    rows = tl.load(visible_ptr + t * stride_vt + e, mask=in_row, other=-1).to(tl.int64)
    live = rows >= 0
    out_ptrs = out_ptr + t * stride_ot + e
    if tl.max(live.to(tl.int32), 0) == 0:
        tl.store(out_ptrs, tl.full([BLOCK_E], float("-inf"), tl.float32), mask=in_row)
        return
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    q_mask = (h < NUM_HEADS)[:, None] & (d < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + t * stride_qt + h[:, None] * stride_qh + d[None, :], mask=q_mask, other=0.0)
    k_mask = live[:, None] & (d < HEAD_DIM)[None, :]
    k = tl.load(keys_ptr + rows[:, None] * stride_ks + d[None, :], mask=k_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BLOCK_H, BLOCK_E)
    w = tl.load(weights_ptr + t * stride_wt + h, mask=h < NUM_HEADS, other=0.0).to(tl.float32)
    scores = tl.sum(tl.maximum(s, 0.0) * w[:, None], 0) * scale  # (BLOCK_E,)
    tl.store(out_ptrs, tl.where(live, scores, float("-inf")), mask=in_row)


def indexer_scores(
    q: torch.Tensor,  # (Q, H, D): the indexer's roped queries
    weights: torch.Tensor,  # (Q, H): each head's weight per query
    keys: torch.Tensor,  # (pool rows, D): the layer's indexer keys
    visible: torch.Tensor,  # (Q, E) int32/int64: pool rows each query may see, -1 padded
    scale: float,
) -> torch.Tensor:
    """(Q, E) fp32, as v4_reference.indexer_scores_reference: -inf where visible is -1."""
    device = q.device
    check_device(device)
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES, device=device)
    check_tensor("keys", keys, ndim=2, dtypes=FLOAT_DTYPES, device=device)
    check_tensor("weights", weights, ndim=2, dtypes=FLOAT_DTYPES, device=device)
    check_tensor("visible", visible, ndim=2, dtypes=INDEX_DTYPES, device=device)
    num_queries, num_heads, head_dim = q.shape
    check_same("keys", keys.shape[1], head_dim, "head_dim (q's last dimension)")
    check_same("weights", tuple(weights.shape), (num_queries, num_heads), "shape")
    check_same("visible", visible.shape[0], num_queries, "number of rows (one per query)")
    if not 1 <= num_heads <= MAX_HEADS or not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"the indexer kernel takes up to {MAX_HEADS} heads of up to {MAX_HEAD_DIM}; got "
            f"{num_heads} heads of {head_dim}"
        )
    num_entries = visible.shape[1]
    out = torch.empty(num_queries, num_entries, dtype=torch.float32, device=device)
    if out.numel() == 0:
        return out
    # A pool in another dtype than q: both operands widened to fp32 in the kernel.
    dot_dtype = keys.dtype if q.dtype == keys.dtype else torch.float32
    block_e = min(BLOCK_E, max(16, next_pow2(num_entries)))
    grid = (num_queries, triton.cdiv(num_entries, block_e))
    _indexer_scores_kernel[grid](
        q, weights, keys, visible, out, num_entries, scale,
        q.stride(0), q.stride(1), weights.stride(0), keys.stride(0), visible.stride(0),
        out.stride(0),
        NUM_HEADS=num_heads, HEAD_DIM=head_dim,
        BLOCK_H=max(16, next_pow2(num_heads)), BLOCK_D=max(16, next_pow2(head_dim)),
        BLOCK_E=block_e, UPCAST=dot_dtype != keys.dtype or upcast_dot(dot_dtype, device),
        PRECISION=dot_precision(dot_dtype), num_warps=4,
    )  # fmt: skip
    return out
