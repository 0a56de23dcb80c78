"""DeepSeek-V4's compressor pooling: each closing window of `rate` tokens becomes one entry, the
softmax(gate + bias)-weighted sum of its tokens' kv per channel, RMS-normed, roped at the
window's position (v4_reference.compress_pool_reference says it in torch). CSA's windows
overlap: an entry also pools the previous window's first series of channels.

Program n pools window n, reading its tokens' raw projections straight from the projections
pool through the window's slot rows (and the previous window's, -1 where there is none: those
rows take no weight). The softmax runs online over tiles of BLOCK_R window positions (as flash
attention's over keys), per channel, so HCA's 128-token windows need no 128-row tile. Channels
are held as two halves, even and odd: the rope rotates pairs (2j, 2j + 1), which then sit in the
same lane of the two halves.
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

TILE_ELEMENTS = 4096  # window positions × channel pairs per tile


@triton.jit
def _pool_half(
    proj_ptr, bias_ptr, src_slot, bias_row, live, chan, chan_mask, gate_offset, stride_ps,
    stride_bias,
):  # fmt: skip
    """(kv, gate + bias) of one tile's positions (rows) at channels `chan` (columns), fp32;
    gate -inf and kv 0 where a position is not live."""
    mask = live[:, None] & chan_mask[None, :]
    kv_ptrs = proj_ptr + src_slot[:, None] * stride_ps + chan
    kv = tl.load(kv_ptrs, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(kv_ptrs + gate_offset, mask=mask, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + bias_row[:, None] * stride_bias + chan, mask=mask, other=0.0)
    gate = tl.where(mask, gate + bias.to(tl.float32), float("-inf"))
    return kv, gate


@triton.jit
def _online_update(kv, gate, m_i, l_i, acc):
    """Fold a tile into each channel's running softmax max, sum and weighted kv."""
    m_new = tl.maximum(m_i, tl.max(gate, 0))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(gate - m_safe[None, :])
    alpha = tl.exp(m_i - m_safe)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p * kv, 0)


@triton.jit
def _compress_pool_kernel(
    proj_ptr, slots_ptr, prev_slots_ptr, bias_ptr, norm_ptr, cos_ptr, sin_ptr, out_ptr,
    eps,
    stride_ps, stride_sn, stride_pn, stride_bias, stride_cn, stride_on,
    RATE: tl.constexpr, HEAD_DIM: tl.constexpr, WIDTH: tl.constexpr, ROPE_DIM: tl.constexpr,
    OVERLAP: tl.constexpr, POSITIONS: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_C)  # channel pair: channels 2j and 2j + 1
    chan_mask = j < HEAD_DIM // 2
    m_even = tl.full([BLOCK_C], float("-inf"), tl.float32)
    m_odd = tl.full([BLOCK_C], float("-inf"), tl.float32)
    l_even = tl.zeros([BLOCK_C], tl.float32)
    l_odd = tl.zeros([BLOCK_C], tl.float32)
    acc_even = tl.zeros([BLOCK_C], tl.float32)
    acc_odd = tl.zeros([BLOCK_C], tl.float32)
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
            series = tl.where(is_prev, 0, HEAD_DIM)
        else:
            bias_row = r
            src_slot = tl.load(slots_ptr + n * stride_sn + r, mask=in_window, other=-1).to(tl.int64)
            series = tl.zeros([BLOCK_R], tl.int32)
        live = in_window & (src_slot >= 0)
        even = series[:, None] + 2 * j[None, :]  # (BLOCK_R, BLOCK_C) channels in the series
        kv, gate = _pool_half(proj_ptr, bias_ptr, src_slot, bias_row, live, even, chan_mask,
                              WIDTH, stride_ps, stride_bias)  # fmt: skip
        m_even, l_even, acc_even = _online_update(kv, gate, m_even, l_even, acc_even)
        kv, gate = _pool_half(proj_ptr, bias_ptr, src_slot, bias_row, live, even + 1, chan_mask,
                              WIDTH, stride_ps, stride_bias)  # fmt: skip
        m_odd, l_odd, acc_odd = _online_update(kv, gate, m_odd, l_odd, acc_odd)
    pooled_even = tl.where(chan_mask, acc_even / l_even, 0.0)
    pooled_odd = tl.where(chan_mask, acc_odd / l_odd, 0.0)
    mean_square = (tl.sum(pooled_even * pooled_even, 0) + tl.sum(pooled_odd * pooled_odd, 0)) / (
        HEAD_DIM
    )
    inv = tl.rsqrt(mean_square + eps)
    w_even = tl.load(norm_ptr + 2 * j, mask=chan_mask, other=0.0).to(tl.float32)
    w_odd = tl.load(norm_ptr + 2 * j + 1, mask=chan_mask, other=0.0).to(tl.float32)
    x_even = pooled_even * inv * w_even
    x_odd = pooled_odd * inv * w_odd
    # The rope on the trailing ROPE_DIM channels: pair j at cos/sin column 2j - (HEAD_DIM -
    # ROPE_DIM); the pairs before it keep cos 1, sin 0.
    rope_col = 2 * j - (HEAD_DIM - ROPE_DIM)
    roped = chan_mask & (rope_col >= 0)
    cos = tl.load(cos_ptr + n * stride_cn + rope_col, mask=roped, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + n * stride_cn + rope_col, mask=roped, other=0.0).to(tl.float32)
    out = out_ptr + n * stride_on + 2 * j
    tl.store(out, x_even * cos - x_odd * sin, mask=chan_mask)
    tl.store(out + 1, x_odd * cos + x_even * sin, mask=chan_mask)


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
    block_c = next_pow2(head_dim // 2)
    positions = 2 * rate if overlap else rate
    block_r = max(2, min(next_pow2(positions), TILE_ELEMENTS // block_c))
    _compress_pool_kernel[(num_windows,)](
        projections[:, column:], slots, prev_slots if overlap else slots, position_bias,
        norm_weight, cos, sin, out, eps,
        projections.stride(0), slots.stride(0), prev_slots.stride(0) if overlap else 0,
        position_bias.stride(0), cos.stride(0), out.stride(0),
        RATE=rate, HEAD_DIM=head_dim, WIDTH=width, ROPE_DIM=rope_dim, OVERLAP=overlap,
        POSITIONS=positions, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4,
    )  # fmt: skip
    return out
