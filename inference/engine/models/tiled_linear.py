"""x · Wᵀ on the CPU for a weight held in a compact form, dequantized a tile of rows at a time.

Dequantizing a whole weight to fp32 on every call writes 4 bytes a value into memory allocated
afresh each time, and on a CPU the page faults of that fresh memory, not the bytes read, are
the cost (a 32 MB torch.empty().fill_() takes ~17 ms on this machine; 94% of a mid-size
DeepSeek-V4 checkpoint's decode step went to unpacking FP4 experts: issue 35). Here TILE_VALUES
weight values at a time (1 MB of fp32, within a core's L2) are dequantized into one buffer,
multiplied while they are hot, and the buffer is reused for the next rows: the weight is read
once, in its compact form, and nothing the size of the weight is allocated. That size is for a
decode step's few rows, whose GEMM reads the tile as fast as it can be written; a caller
multiplying many rows (a prefill chunk: compute-bound) passes a larger tile, so that the GEMM is
not cut into many small ones (quantized_linear.PREFILL_TILE_VALUES).

Tiles are rows of the (out, in) weight, so every output value is still one full dot product over
the input: the output is the one a model holding the dequantized values gives. The formats'
own fills: packed/cpu_tiles.py (DeepSeek's FP8 and FP4), quantized_linear.py (int8 / int4).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

TILE_VALUES = 1 << 18  # weight values dequantized at once: 1 MB of fp32


def tiled_linear(
    x: torch.Tensor,  # (M, in) fp32
    out_features: int,
    in_features: int,
    fill: Callable[[torch.Tensor, int, int], None],  # dequantize rows [lo, hi) into a tile
    tile_values: int | None = None,  # the tile's size in weight values (None: TILE_VALUES)
) -> torch.Tensor:
    """(M, out_features) fp32 = x · Wᵀ, W's rows [lo, hi) written by `fill(tile, lo, hi)` into
    a (hi - lo, in_features) fp32 tile of at most `tile_values` values just before they are
    multiplied."""
    out = torch.empty(x.shape[0], out_features, dtype=torch.float32)
    rows_per_tile = max(1, (tile_values or TILE_VALUES) // in_features)
    buffer = torch.empty(min(rows_per_tile, out_features), in_features, dtype=torch.float32)
    for lo in range(0, out_features, rows_per_tile):
        hi = min(lo + rows_per_tile, out_features)
        tile = buffer[: hi - lo]
        fill(tile, lo, hi)
        torch.mm(x, tile.t(), out=out[:, lo:hi])
    return out
