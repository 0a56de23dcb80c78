"""x · dequantize(W)ᵀ on the CPU over DeepSeek's packed FP8 / FP4 weights, a tile of rows at a
time (tiled_linear.py: why tiles, and why the output is the dequantized weights'): each format's
fill, dequantizing a tile of rows from the packed bytes.
"""

from __future__ import annotations

import torch

from inference.engine.models.packed.formats import (
    E2M1_VALUES,
    FP4_GROUP,
    FP8_BLOCK,
    scale_to_float,
)
from inference.engine.models.tiled_linear import tiled_linear


def _fp4_byte_pairs() -> torch.Tensor:
    """(256,) int64: byte b's two e2m1 values (low nibble first) as one pair of fp32 bit
    patterns, so that one gather writes both."""
    values = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    pairs = torch.stack([values.repeat(16), values.repeat_interleave(16)], dim=-1)
    return pairs.contiguous().view(torch.int64).reshape(256)


_FP4_PAIRS = _fp4_byte_pairs()


def fp4_linear(
    x: torch.Tensor,  # (M, in) fp32
    packed: torch.Tensor,  # (out, in / 2) FP4 bytes
    scale: torch.Tensor,  # (out, in / FP4_GROUP) e8m0 bytes
) -> torch.Tensor:
    """(M, out) fp32 = x · dequantize_fp4(packed, scale)ᵀ."""
    out_features, in_features = packed.shape[0], 2 * packed.shape[1]
    codes = packed.view(torch.uint8)

    def fill(tile: torch.Tensor, lo: int, hi: int) -> None:
        torch.index_select(
            _FP4_PAIRS, 0, codes[lo:hi].reshape(-1).int(), out=tile.view(torch.int64).view(-1)
        )
        tile.view(hi - lo, -1, FP4_GROUP).mul_(scale_to_float(scale[lo:hi])[..., None])

    return tiled_linear(x, out_features, in_features, fill)


def fp8_linear(
    x: torch.Tensor,  # (M, in) fp32
    weight: torch.Tensor,  # (N, in) e4m3
    scale: torch.Tensor,  # (ceil(N / block), ceil(in / block)): fp32 or e8m0 bytes
    rows: range | None = None,  # the weight's rows to multiply by (default all)
    block: int = FP8_BLOCK,
) -> torch.Tensor:
    """(M, len(rows)) fp32 = x · dequantize_fp8(weight, scale)[rows]ᵀ (edge blocks partial)."""
    rows = rows if rows is not None else range(weight.shape[0])
    in_features = weight.shape[1]
    scales = scale_to_float(scale)
    whole = in_features // block * block  # inputs in whole column blocks

    def fill(tile: torch.Tensor, lo: int, hi: int) -> None:
        first = rows.start + lo
        tile.copy_(weight[first : rows.start + hi])  # e4m3 → fp32
        row_scales = scales[torch.arange(first, rows.start + hi) // block]  # (rows, col blocks)
        if whole:
            tile[:, :whole].view(hi - lo, -1, block).mul_(row_scales[:, : whole // block, None])
        if whole < in_features:
            tile[:, whole:].mul_(row_scales[:, -1:])

    return tiled_linear(x, len(rows), in_features, fill)
