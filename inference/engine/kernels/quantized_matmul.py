"""Matmuls over DeepSeek's packed weights (models/packed/formats.py has the byte layouts), the
weights dequantized a tile at a time in registers, never written out whole:

- fp8_block_linear: x (M, K) @ W.T for an e4m3 W (N, K) with a scale per block x block tile.
- fp4_grouped_matmul: the routed experts as one launch. x's rows are sorted by expert; rows
  expert_offsets[e]:expert_offsets[e + 1] multiply expert e's e2m1 W (N, K), scaled per 32 inputs.

The weight bytes are loaded as uint8 and decoded arithmetically (sign, exponent and mantissa
placed into fp32 bits), not through triton's fp8 types: the interpreter lacks some of them and
the bit route runs the same on every GPU. Every e4m3 and e2m1 value is exact in fp32, bf16 and
fp16, so the decoded tile is cast to x's dtype losslessly and the dot accumulates in fp32.
These are the correct kernels the CUDA path uses; making them fast (tensor-core fp8, dot_scaled)
comes later. Their torch references, the CPU path, are in quantized_dispatch.py.
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
from inference.engine.kernels.quantized_dispatch import (
    fp4_grouped_matmul_reference,
    fp8_block_linear_reference,
)
from inference.engine.models.packed.formats import FP4_GROUP, FP8_BLOCK, fp8_scale_grid

__all__ = [
    "fp4_grouped_matmul",
    "fp4_grouped_matmul_reference",
    "fp8_block_linear",
    "fp8_block_linear_reference",
]

BYTE_DTYPES = (torch.uint8, torch.int8)
FP8_SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.uint8)
FP4_X_DTYPES = (torch.float32, torch.bfloat16)  # e2m1 x an e8m0 scale can leave fp16's range
BLOCK_N = 64
FP4_BLOCK_K = 128  # four scale groups a tile


@triton.jit
def _e8m0_to_fp32(byte):
    """2 ** (byte - 127) as fp32 bits; byte 0 is the subnormal 2 ** -127, 255 comes out inf."""
    bits = tl.where(byte == 0, 0x400000, byte << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _e4m3fn_to_fp32(byte):
    """An e4m3fn byte (int32 in [0, 255]) → its fp32 value: bias 7, no infinities, 0x7F and
    0xFF NaN, exponent field 0 subnormal (mantissa x 2 ** -9)."""
    exponent = (byte >> 3) & 0xF
    mantissa = byte & 0x7
    normal = (((exponent + 120) << 23) | (mantissa << 20)).to(tl.float32, bitcast=True)
    value = tl.where(exponent == 0, mantissa.to(tl.float32) * 0.001953125, normal)
    value = tl.where((byte & 0x80) != 0, -value, value)
    return tl.where((byte & 0x7F) == 0x7F, float("nan"), value)


@triton.jit
def _e2m1_to_fp32(code):
    """An e2m1 nibble (int32 in [0, 15]) → its fp32 value: bias 1, exponent field 0 subnormal
    (mantissa x 0.5), so the magnitudes are 0, 0.5, 1, 1.5, 2, 3, 4, 6."""
    exponent = (code >> 1) & 0x3
    mantissa = code & 0x1
    normal = (((exponent + 126) << 23) | (mantissa << 22)).to(tl.float32, bitcast=True)
    value = tl.where(exponent == 0, mantissa.to(tl.float32) * 0.5, normal)
    return tl.where((code & 0x8) != 0, -value, value)


@triton.jit
def _fp8_block_linear_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_sn, stride_sk, stride_om,
    SCALE_BLOCK: tl.constexpr, SCALE_E8M0: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    m_mask = m < M
    n_mask = n < N
    # BLOCK_N and BLOCK_K divide SCALE_BLOCK: a tile's columns share one scale column, its rows
    # one scale row, so the scale applies to the dot's result per output column.
    scale_row = (pid_n * BLOCK_N) // SCALE_BLOCK
    x_rows = x_ptr + m[:, None].to(tl.int64) * stride_xm
    w_rows = w_ptr + n[:, None].to(tl.int64) * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + kk
        k_mask = k < K
        x_mask = m_mask[:, None] & k_mask[None, :]
        x = tl.load(x_rows + k[None, :], mask=x_mask, other=0.0)  # (BLOCK_M, BLOCK_K)
        w_mask = n_mask[:, None] & k_mask[None, :]
        byte = tl.load(w_rows + k[None, :], mask=w_mask, other=0)  # (BLOCK_N, BLOCK_K)
        byte = byte.to(tl.int32) & 0xFF  # masked bytes decode to 0
        w = _e4m3fn_to_fp32(byte)
        if UPCAST:
            x = x.to(tl.float32)
        else:
            w = w.to(x.dtype)
        part = tl.dot(x, tl.trans(w), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
        scale = tl.load(scale_ptr + scale_row * stride_sn + (k0 // SCALE_BLOCK) * stride_sk)
        if SCALE_E8M0:
            scale = _e8m0_to_fp32(scale.to(tl.int32) & 0xFF)
        acc += part * scale.to(tl.float32)
    out = out_ptr + m[:, None].to(tl.int64) * stride_om + n[None, :]
    tl.store(out, acc, mask=m_mask[:, None] & n_mask[None, :])


def fp8_block_linear(
    x: torch.Tensor,  # (M, K) fp32 / bf16 / fp16
    weight: torch.Tensor,  # (N, K) torch.float8_e4m3fn (or its bytes as uint8)
    scale: torch.Tensor,  # (ceil(N / block), ceil(K / block)) fp32/bf16/fp16, or e8m0 uint8
    block: int = FP8_BLOCK,
) -> torch.Tensor:
    """(M, N) fp32 = x @ dequantize_fp8(weight, scale, block).T; a (1, 1) or 0-d scale is one
    scale for the whole weight."""
    device = x.device
    check_device(device)
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES, device=device)
    weight = _as_bytes(weight, "weight", (torch.float8_e4m3fn, *BYTE_DTYPES))
    check_tensor("weight", weight, ndim=2, dtypes=BYTE_DTYPES, device=device)
    if block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two ≥ 16, got {block}")
    num_rows, num_cols = x.shape
    out_features = weight.shape[0]
    check_same("weight", weight.shape[1], num_cols, "in_features (x's last dimension)")
    scale, scale_e8m0 = _fp8_scale(scale, weight.shape, block, device)
    out = torch.empty(num_rows, out_features, dtype=torch.float32, device=device)
    if out.numel() == 0:
        return out
    if num_cols == 0:
        return out.zero_()
    block_m = min(64, max(16, next_pow2(num_rows)))
    block_n = min(BLOCK_N, block)
    block_k = min(128, block)
    one_scale = scale.numel() == 1
    grid = (triton.cdiv(num_rows, block_m), triton.cdiv(out_features, block_n))
    _fp8_block_linear_kernel[grid](
        x, weight, scale, out, num_rows, out_features, num_cols,
        x.stride(0), weight.stride(0), 0 if one_scale else scale.stride(0),
        0 if one_scale else scale.stride(1), out.stride(0),
        SCALE_BLOCK=block, SCALE_E8M0=scale_e8m0,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        UPCAST=upcast_dot(x.dtype, device), PRECISION=dot_precision(x.dtype),
        num_warps=4, num_stages=2,
    )  # fmt: skip
    return out


@triton.jit
def _fp4_grouped_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, offsets_ptr, tile_starts_ptr,
    T, N, K,
    stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_om,
    NUM_EXPERTS: tl.constexpr, SEARCH_STEPS: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)  # a BLOCK_M tile of one expert's rows
    pid_n = tl.program_id(1)
    if tile >= tl.load(tile_starts_ptr + NUM_EXPERTS):
        return  # the grid is an upper bound on the tiles
    # The expert: the last e with tile_starts[e] <= tile (empty experts own no tile, so the
    # search passes over them), by bisection over [0, NUM_EXPERTS).
    lo = 0
    hi = NUM_EXPERTS
    for _ in range(SEARCH_STEPS):
        mid = (lo + hi) // 2
        go = tl.load(tile_starts_ptr + mid) <= tile
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid)
    expert = lo
    first_tile = tl.load(tile_starts_ptr + expert)
    row_start = tl.load(offsets_ptr + expert).to(tl.int32)
    row_end = tl.minimum(tl.load(offsets_ptr + expert + 1).to(tl.int32), T)
    m = row_start + (tile - first_tile) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = (m < row_end) & (m >= 0)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    j = tl.arange(0, BLOCK_K // 2)  # byte j of a tile holds inputs 2j (low nibble) and 2j + 1
    w_rows = w_ptr + expert.to(tl.int64) * stride_we + n[:, None].to(tl.int64) * stride_wn
    s_rows = scale_ptr + expert.to(tl.int64) * stride_se + n[:, None].to(tl.int64) * stride_sn
    x_rows = x_ptr + m[:, None].to(tl.int64) * stride_xm
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + 2 * j  # the even inputs of the tile
        k_mask = k < K  # K is even: an even input in range has its odd partner in range
        x_even = tl.load(x_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        x_odd = tl.load(
            x_rows + k[None, :] + 1, mask=m_mask[:, None] & k_mask[None, :], other=0.0
        )  # (BLOCK_M, BLOCK_K / 2)
        w_mask = n_mask[:, None] & k_mask[None, :]
        byte = tl.load(w_rows + k[None, :] // 2, mask=w_mask, other=0).to(tl.int32) & 0xFF
        scale_byte = tl.load(s_rows + k[None, :] // GROUP, mask=w_mask, other=127)
        scale = _e8m0_to_fp32(scale_byte.to(tl.int32) & 0xFF)  # (BLOCK_N, BLOCK_K / 2)
        w_even = _e2m1_to_fp32(byte & 0xF) * scale
        w_odd = _e2m1_to_fp32(byte >> 4) * scale
        if UPCAST:
            x_even = x_even.to(tl.float32)
            x_odd = x_odd.to(tl.float32)
        else:
            w_even = w_even.to(x_even.dtype)
            w_odd = w_odd.to(x_odd.dtype)
        acc += tl.dot(x_even, tl.trans(w_even), input_precision=PRECISION)
        acc += tl.dot(x_odd, tl.trans(w_odd), input_precision=PRECISION)
    out = out_ptr + m[:, None].to(tl.int64) * stride_om + n[None, :]
    tl.store(out, acc, mask=m_mask[:, None] & n_mask[None, :])


def fp4_grouped_matmul(
    x: torch.Tensor,  # (T, K) fp32 / bf16, rows sorted by expert
    expert_offsets: torch.Tensor,  # (E + 1,) int32/int64: expert e owns rows [o[e], o[e + 1])
    weight: torch.Tensor,  # (E, N, K / 2) e2m1 pairs, low nibble first (uint8)
    scale: torch.Tensor,  # (E, N, K / 32) e8m0 bytes (uint8)
) -> torch.Tensor:
    """(T, N) fp32: each expert's rows @ dequantize_fp4(weight[e], scale[e]).T. Offsets must be
    non-decreasing from 0; rows outside every group (past expert_offsets[E]) come back 0."""
    device = x.device
    check_device(device)
    check_tensor("x", x, ndim=2, dtypes=FP4_X_DTYPES, device=device)
    check_tensor("expert_offsets", expert_offsets, ndim=1, dtypes=INDEX_DTYPES, device=device)
    weight = _as_bytes(weight, "weight", BYTE_DTYPES, fp4=True)
    check_tensor("weight", weight, ndim=3, dtypes=BYTE_DTYPES, device=device)
    scale = _as_bytes(scale, "scale", BYTE_DTYPES, e8m0=True)
    check_tensor("scale", scale, ndim=3, dtypes=BYTE_DTYPES, device=device)
    num_experts, out_features, row_bytes = weight.shape
    num_rows, num_cols = x.shape
    check_same("weight", 2 * row_bytes, num_cols, "in_features (2 x its bytes a row)")
    if num_cols % FP4_GROUP:
        raise ValueError(f"x: K ({num_cols}) must be a multiple of the FP4 group {FP4_GROUP}")
    check_same("scale", tuple(scale.shape), (num_experts, out_features, num_cols // FP4_GROUP),
               "shape (one e8m0 byte per 32 inputs of each expert's row)")  # fmt: skip
    check_same("expert_offsets", expert_offsets.shape[0], num_experts + 1, "length (experts + 1)")
    out = torch.zeros(num_rows, out_features, dtype=torch.float32, device=device)
    if out.numel() == 0 or num_cols == 0 or num_experts == 0:
        return out
    block_m = min(64, max(16, next_pow2(num_rows)))
    # Tiles per expert on the device (no sync): each non-empty expert wastes at most one part
    # tile, which bounds the grid.
    counts = (expert_offsets[1:] - expert_offsets[:-1]).clamp(min=0)
    tile_starts = torch.zeros(num_experts + 1, dtype=torch.int32, device=device)
    tile_starts[1:] = torch.cumsum((counts + block_m - 1) // block_m, 0)
    num_tiles = triton.cdiv(num_rows, block_m) + min(num_experts, num_rows)
    grid = (num_tiles, triton.cdiv(out_features, BLOCK_N))
    _fp4_grouped_kernel[grid](
        x, weight, scale, out, expert_offsets, tile_starts, num_rows, out_features, num_cols,
        x.stride(0), weight.stride(0), weight.stride(1), scale.stride(0), scale.stride(1),
        out.stride(0),
        NUM_EXPERTS=num_experts, SEARCH_STEPS=max(1, (num_experts - 1).bit_length()),
        GROUP=FP4_GROUP, BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=FP4_BLOCK_K,
        UPCAST=upcast_dot(x.dtype, device), PRECISION=dot_precision(x.dtype),
        num_warps=4, num_stages=2,
    )  # fmt: skip
    return out


def _as_bytes(
    t: object, name: str, dtypes: tuple[torch.dtype, ...], *, fp4: bool = False, e8m0=False
) -> object:
    """The tensor's bytes as uint8 (a view, same shape) when it holds one-byte packed values:
    torch's float8 / float4-pair / e8m0 types load as bytes and are decoded in the kernels."""
    if not isinstance(t, torch.Tensor):
        return t  # check_tensor names it
    packed_names = {"torch.float4_e2m1fn_x2"} if fp4 else set()
    if e8m0:
        packed_names.add("torch.float8_e8m0fnu")
    if t.dtype in dtypes or str(t.dtype) in packed_names:
        return t.view(torch.uint8)
    allowed = [str(d) for d in dtypes] + sorted(packed_names)
    raise ValueError(f"{name} must be one of {allowed}, got {t.dtype}")


def _fp8_scale(
    scale: object, weight_shape: torch.Size, block: int, device: torch.device
) -> tuple[torch.Tensor, bool]:
    """The scale grid checked against the weight; (scale, whether it holds e8m0 bytes)."""
    if isinstance(scale, torch.Tensor) and str(scale.dtype) == "torch.float8_e8m0fnu":
        scale = scale.view(torch.uint8)
    if isinstance(scale, torch.Tensor) and scale.numel() == 1:
        scale = scale.reshape(1, 1)
    check_tensor("scale", scale, ndim=2, dtypes=FP8_SCALE_DTYPES, device=device,
                 inner_contiguous=False)  # fmt: skip
    want = fp8_scale_grid(*weight_shape, block)
    if scale.numel() != 1 and tuple(scale.shape) != want:
        raise ValueError(
            f"scale: its grid {tuple(scale.shape)} does not cover the weight "
            f"{tuple(weight_shape)} in {block} x {block} blocks (expected {want})"
        )
    return scale, scale.dtype == torch.uint8
