"""models/packed's modules on the CPU: an Fp8Linear (ragged 128-blocks) and Fp4Experts compute
what dense layers holding their dequantized values compute; they survive the runner's
`Module.to(dtype)`; Fp4Experts holds a range of experts and slices to a sub-range."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from inference.engine.models.packed.experts import Fp4Experts
from inference.engine.models.packed.formats import (
    dequantize_fp4,
    dequantize_fp8,
    quantize_fp4,
    quantize_fp8,
)
from inference.engine.models.packed.linear import Fp8Linear


def test_fp8_linear_equals_the_dequantized_dense_layer_on_ragged_blocks():
    generator = torch.Generator().manual_seed(0)
    weight, scale = quantize_fp8(torch.randn(200, 300, generator=generator))  # 2 x 3 blocks
    layer = Fp8Linear.from_packed("w", weight, scale)
    x = torch.randn(5, 300, generator=generator)
    expected = F.linear(x, dequantize_fp8(weight, scale))
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    layer = layer.to(torch.bfloat16)  # the runner's cast must not touch the packed bytes
    assert layer.weight.dtype == torch.uint8 and layer.scale_grid().dtype == torch.float32
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_fp4_experts_equal_a_dense_loop_over_the_experts_they_hold():
    generator = torch.Generator().manual_seed(1)
    hidden, inter, limit = 64, 32, 7.0
    gate_up, gate_up_scale = quantize_fp4(torch.randn(4, 2 * inter, hidden, generator=generator))
    down, down_scale = quantize_fp4(torch.randn(4, hidden, inter, generator=generator))
    experts = Fp4Experts(hidden, inter, limit, range(2, 6))
    for local in range(4):
        for which, rows in (("w1", slice(0, inter)), ("w3", slice(inter, None))):
            experts.set_projection(
                which, 2 + local, which, gate_up[local, rows], gate_up_scale[local, rows]
            )
        experts.set_projection("w2", 2 + local, "w2", down[local], down_scale[local])
    x = torch.randn(7, hidden, generator=generator)
    indices = torch.randint(0, 8, (7, 2), generator=generator)  # experts 0, 1, 6, 7: elsewhere
    weights = torch.rand(7, 2, generator=generator)
    dense_gate_up, dense_down = (
        dequantize_fp4(gate_up, gate_up_scale),
        dequantize_fp4(down, down_scale),
    )
    expected = torch.zeros_like(x)
    for t in range(7):
        for slot in range(2):
            e = int(indices[t, slot]) - 2
            if not 0 <= e < 4:
                continue
            g, u = (dense_gate_up[e] @ x[t]).chunk(2)
            h = F.silu(g.clamp(max=limit)) * u.clamp(-limit, limit)
            expected[t] += weights[t, slot] * (dense_down[e] @ h)
    torch.testing.assert_close(experts(x, indices, weights), expected, rtol=1e-5, atol=1e-5)
    upper = experts.sliced(range(4, 6))
    mine = (indices >= 4) & (indices < 6)
    masked = torch.where(mine, indices, 0)
    torch.testing.assert_close(
        upper(x, masked, weights * mine), experts(x, masked, weights * mine), rtol=1e-6, atol=1e-6
    )


def test_the_cpu_tiles_cover_every_row_when_tiles_end_inside_blocks(monkeypatch):
    """Tiles of 7 rows (so tiles end inside 128-row blocks and the last tile is partial): the
    tiled products equal the dequantized weights' for FP8 (float and e8m0 scales, a range of
    rows) and FP4."""
    from inference.engine.models import tiled_linear
    from inference.engine.models.packed import cpu_tiles

    monkeypatch.setattr(tiled_linear, "TILE_VALUES", 7 * 300)
    generator = torch.Generator().manual_seed(2)
    close = {"rtol": 1e-4, "atol": 1e-4}  # the same values summed by another matmul
    weight, scale = quantize_fp8(torch.randn(200, 300, generator=generator))
    x = torch.randn(3, 300, generator=generator)
    dense = dequantize_fp8(weight, scale)
    torch.testing.assert_close(cpu_tiles.fp8_linear(x, weight, scale), x @ dense.T, **close)
    rows = range(120, 190)  # across the first row block's end
    torch.testing.assert_close(
        cpu_tiles.fp8_linear(x, weight, scale, rows), x @ dense[120:190].T, **close
    )
    exponents = torch.randint(118, 124, scale.shape, dtype=torch.uint8, generator=generator)
    torch.testing.assert_close(
        cpu_tiles.fp8_linear(x, weight, exponents), x @ dequantize_fp8(weight, exponents).T, **close
    )
    packed, fp4_scale = quantize_fp4(torch.randn(45, 320, generator=generator))
    x = torch.randn(4, 320, generator=generator)
    expected = x @ dequantize_fp4(packed, fp4_scale).T
    torch.testing.assert_close(cpu_tiles.fp4_linear(x, packed, fp4_scale), expected, **close)
