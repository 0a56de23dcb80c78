"""x · dequantize(W)ᵀ on the CPU over a packed weight, a tile of rows at a time.

Dequantizing a whole weight to fp32 on every call writes 4 (FP8) or 8 (FP4) bytes per byte
held into memory allocated afresh each time: on a CPU that, not the bytes read, was a DeepSeek-V4
decode step (94% of a mid-size checkpoint's step went to unpacking FP4 experts; issue 35). Here
TILE_VALUES weight values at a time (1 MB of fp32, within a core's L2) are dequantized into one
buffer, multiplied while they are hot, and the buffer is reused for the next rows: the weight is
read once, in its packed form, and nothing the size of the weight is allocated.

Tiles are rows of the (out, in) weight, so every output value is still one full dot product over
the input: the output is the one a model holding the dequantized values gives.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from inference.engine.models.packed.formats import (
    E2M1_VALUES,
    FP4_GROUP,
    FP8_BLOCK,
    scale_to_float,
)

TILE_VALUES = 1 << 18  # weight values dequantized at once: 1 MB of fp32


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

    return _tiled(x, out_features, in_features, fill)


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

    return _tiled(x, len(rows), in_features, fill)


def _tiled(
    x: torch.Tensor,
    out_features: int,
    in_features: int,
    fill: Callable[[torch.Tensor, int, int], None],  # dequantize rows [lo, hi) into a tile
) -> torch.Tensor:
    out = torch.empty(x.shape[0], out_features, dtype=torch.float32)
    rows_per_tile = max(1, TILE_VALUES // in_features)
    buffer = torch.empty(min(rows_per_tile, out_features), in_features, dtype=torch.float32)
    for lo in range(0, out_features, rows_per_tile):
        hi = min(lo + rows_per_tile, out_features)
        tile = buffer[: hi - lo]
        fill(tile, lo, hi)
        torch.mm(x, tile.t(), out=out[:, lo:hi])
    return out
