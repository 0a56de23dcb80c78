"""DeepSeek-V4's compressor pooling: each closing window of `rate` tokens becomes one entry, the
softmax(gate + bias)-weighted sum of its tokens' kv per channel, RMS-normed, roped at the
window's position (v4_reference.compress_pool_reference says it in torch). CSA's windows
overlap: an entry also pools the previous window's first series of channels.

Program n pools window n, reading its tokens' raw projections straight from the projections
pool through the window's slot rows (and the previous window's, -1 where there is none: those
rows take no weight). The softmax runs online over tiles of BLOCK_R window positions (as flash
attention's over keys), per channel, so HCA's 128-token windows need no 128-row tile at a
head_dim of 512; the norm and the rope then act on the program's one pooled row.
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

TILE_ELEMENTS = 8192  # window positions × channels per tile


@triton.jit
def _compress_pool_kernel(
    proj_ptr, slots_ptr, prev_slots_ptr, bias_ptr, norm_ptr, cos_ptr, sin_ptr, out_ptr,
    eps,
    stride_ps, stride_sn, stride_pn, stride_bias, stride_cn, stride_on,
    RATE: tl.constexpr, HEAD_DIM: tl.constexpr, WIDTH: tl.constexpr, ROPE_DIM: tl.constexpr,
    OVERLAP: tl.constexpr, POSITIONS: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_D)
    chan_mask = c < HEAD_DIM
    m_i = tl.full([BLOCK_D], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_D], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    # Window positions: with OVERLAP, 0 .. RATE - 1 are the previous window's (its first series,
    # channels 0 .. HEAD_DIM - 1) and RATE .. 2·RATE - 1 this window's (channels HEAD_DIM on).
    for start in range(0, POSITIONS, BLOCK_R):
        r = start + tl.arange(0, BLOCK_R)
        in_window = r < POSITIONS
        if OVERLAP:
            is_prev = r < RATE
            bias_row = tl.where(is_prev, r, r - RATE)
            prev = tl.load(prev_slots_ptr + n * stride_pn + r, mask=in_window & is_prev, other=-1)
            cur = tl.load(slots_ptr + n * stride_sn + bias_row, mask=in_window & ~is_prev, other=-1)
            src_slot = tl.where(is_prev, prev, cur).to(tl.int64)
            chan = tl.where(is_prev, 0, HEAD_DIM)[:, None] + c[None, :]  # (BLOCK_R, BLOCK_D)
        else:
            bias_row = r
            src_slot = tl.load(slots_ptr + n * stride_sn + r, mask=in_window, other=-1).to(tl.int64)
            chan = tl.zeros([BLOCK_R], tl.int32)[:, None] + c[None, :]
        mask = (in_window & (src_slot >= 0))[:, None] & chan_mask[None, :]
        kv_ptrs = proj_ptr + src_slot[:, None] * stride_ps + chan
        kv = tl.load(kv_ptrs, mask=mask, other=0.0).to(tl.float32)
        gate = tl.load(kv_ptrs + WIDTH, mask=mask, other=0.0).to(tl.float32)
        bias = tl.load(bias_ptr + bias_row[:, None] * stride_bias + chan, mask=mask, other=0.0)
        gate = tl.where(mask, gate + bias.to(tl.float32), float("-inf"))
        # The online softmax over positions, per channel (a missing position weighs 0).
        m_new = tl.maximum(m_i, tl.max(gate, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(gate - m_safe[None, :])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p * kv, 0)
        m_i = m_new
    pooled = tl.where(chan_mask, acc / l_i, 0.0)
    inv = tl.rsqrt(tl.sum(pooled * pooled, 0) / HEAD_DIM + eps)
    x = pooled * inv * tl.load(norm_ptr + c, mask=chan_mask, other=0.0).to(tl.float32)
    # The rope on the trailing ROPE_DIM channels, pairs (2j, 2j + 1): a (BLOCK_D / 2, 2) view
    # splits each pair into its two lanes. The channels before it keep cos 1, sin 0.
    rope_col = c - (HEAD_DIM - ROPE_DIM)
    roped = chan_mask & (rope_col >= 0)
    cos = tl.load(cos_ptr + n * stride_cn + rope_col, mask=roped, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + n * stride_cn + rope_col, mask=roped, other=0.0).to(tl.float32)
    x_even, x_odd = tl.split(tl.reshape(x, [BLOCK_D // 2, 2]))
    cos_pair, _ = tl.split(tl.reshape(cos, [BLOCK_D // 2, 2]))
    sin_pair, _ = tl.split(tl.reshape(sin, [BLOCK_D // 2, 2]))
    out_even = x_even * cos_pair - x_odd * sin_pair
    out_odd = x_odd * cos_pair + x_even * sin_pair
    out = tl.reshape(tl.join(out_even, out_odd), [BLOCK_D])
    tl.store(out_ptr + n * stride_on + c, out, mask=chan_mask)


def compress_pool(
    projections: torch.Tensor,  # (num_slots, columns): each token's raw compressor inputs
    column: int,  # this compressor's first column: its kv, then its gate, `width` each
    slots: torch.Tensor,  # (N, rate): the slots of each closing window's tokens
    prev_slots: torch.Tensor | None,  # (N, rate): the window before's, -1 where none; overlap
    position_bias: torch.Tensor,  # (rate, width)
    norm_weight: torch.Tensor,  # (head_dim,)
    eps: float,
    cos: torch.Tensor,  # (N, rope_dim): the rope at each window's position, pairs repeated
    sin: torch.Tensor,
) -> torch.Tensor:
    """(N, head_dim) fp32, as v4_reference.compress_pool_reference."""
    device = projections.device
    check_device(device)
    check_tensor("projections", projections, ndim=2, dtypes=FLOAT_DTYPES, device=device)
    check_tensor("slots", slots, ndim=2, dtypes=INDEX_DTYPES, device=device)
    check_tensor("position_bias", position_bias, ndim=2, dtypes=FLOAT_DTYPES, device=device)
    check_tensor("norm_weight", norm_weight, ndim=1, dtypes=FLOAT_DTYPES, device=device)
    check_tensor("cos", cos, ndim=2, dtypes=FLOAT_DTYPES, device=device)
    check_tensor("sin", sin, ndim=2, dtypes=FLOAT_DTYPES, device=device)
    num_windows, rate = slots.shape
    head_dim, width, rope_dim = norm_weight.shape[0], position_bias.shape[1], cos.shape[1]
    overlap = prev_slots is not None
    if overlap:
        check_tensor("prev_slots", prev_slots, ndim=2, dtypes=INDEX_DTYPES, device=device)
        check_same("prev_slots", tuple(prev_slots.shape), tuple(slots.shape), "shape")
    check_same("position_bias", tuple(position_bias.shape),
               (rate, 2 * head_dim if overlap else head_dim), "shape (rate, width)")  # fmt: skip
    check_same("cos", cos.shape[0], num_windows, "number of rows (one per window)")
    check_same("sin", tuple(sin.shape), tuple(cos.shape), "shape")
    check_same("sin", sin.stride(), cos.stride(), "stride")
    if head_dim % 2 or rope_dim % 2 or not 0 < rope_dim <= head_dim:
        raise ValueError(
            f"head_dim ({head_dim}) and rope_dim ({rope_dim}) must be even, 0 < rope_dim ≤ head_dim"
        )
    if not 0 <= column <= projections.shape[1] - 2 * width:
        raise ValueError(
            f"column {column} + kv and gate ({2 * width} columns) lie past the projections' "
            f"{projections.shape[1]} columns"
        )
    out = torch.empty(num_windows, head_dim, dtype=torch.float32, device=device)
    if num_windows == 0:
        return out
    block_d = next_pow2(head_dim)
    positions = 2 * rate if overlap else rate
    block_r = max(2, min(next_pow2(positions), TILE_ELEMENTS // block_d))
    _compress_pool_kernel[(num_windows,)](
        projections[:, column:], slots, prev_slots if overlap else slots, position_bias,
        norm_weight, cos, sin, out, eps,
        projections.stride(0), slots.stride(0), prev_slots.stride(0) if overlap else 0,
        position_bias.stride(0), cos.stride(0), out.stride(0),
        RATE=rate, HEAD_DIM=head_dim, WIDTH=width, ROPE_DIM=rope_dim, OVERLAP=overlap,
        POSITIONS=positions, BLOCK_R=block_r, BLOCK_D=block_d, num_warps=4,
    )  # fmt: skip
    return out
