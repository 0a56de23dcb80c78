"""The packed experts' CUDA route (tokens sorted by expert, two fp4_grouped_matmul launches,
the weighted scatter) equals their CPU route, run here under triton's interpreter on CPU
tensors: the sort, the offsets and the scatter are what this adds to the kernels' own tests."""

import torch

from inference.engine.models.packed.experts import Fp4Experts
from inference.engine.models.packed.formats import quantize_fp4


def test_the_grouped_route_equals_the_per_expert_route():
    generator = torch.Generator().manual_seed(3)
    hidden, inter, limit = 64, 32, 7.0
    gate_up, gate_up_scale = quantize_fp4(torch.randn(4, 2 * inter, hidden, generator=generator))
    down, down_scale = quantize_fp4(torch.randn(4, hidden, inter, generator=generator))
    experts = Fp4Experts(hidden, inter, limit, range(2, 6))  # a rank's share: experts 2..5
    for local in range(4):
        for which, rows in (("w1", slice(0, inter)), ("w3", slice(inter, None))):
            experts.set_projection(
                which, 2 + local, which, gate_up[local, rows], gate_up_scale[local, rows]
            )
        experts.set_projection("w2", 2 + local, "w2", down[local], down_scale[local])
    x = torch.randn(9, hidden, generator=generator)
    indices = torch.randint(0, 8, (9, 3), generator=generator)  # some held elsewhere
    indices[0] = torch.tensor([0, 1, 7])  # a token with no expert here
    weights = torch.rand(9, 3, generator=generator)
    # Two routes, two summation orders (and per CPU, different kernels): fp32 rounding, not 1e-5
    # (a 2.3e-5 difference on one of 576 elements was seen on an AMD machine).
    torch.testing.assert_close(
        experts._grouped(x, indices, weights), experts(x, indices, weights), rtol=1e-4, atol=1e-4
    )
