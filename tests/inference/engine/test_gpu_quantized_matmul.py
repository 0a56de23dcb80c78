"""The quantized matmul kernels compiled on a real GPU (marked gpu: skipped without CUDA) against
the torch path, on the ragged shapes kernels/test_quantized_matmul.py checks under the
interpreter, plus V4-sized ones, through the dispatch (which sends CUDA tensors to the kernels)."""

import pytest
import torch

from inference.engine.kernels.quantized_dispatch import (
    fp4_grouped,
    fp4_grouped_matmul_reference,
    fp8_block_linear_reference,
    fp8_linear,
)
from inference.engine.models.packed.formats import quantize_fp4, quantize_fp8

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def _assert_matches(got, want):
    assert got.device.type == "cuda" and got.dtype == torch.float32
    size = max(1.0, want.abs().max().item())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5 * size)


@pytest.mark.parametrize(
    ("num_rows", "out_features", "in_features", "dtype", "e8m0"),
    [
        (37, 200, 300, torch.float32, False),
        (1, 130, 260, torch.bfloat16, True),
        (70, 64, 129, torch.float16, False),
        (300, 1024, 4096, torch.bfloat16, False),  # V4 Flash's wq_a
    ],
)
def test_fp8_linear_on_cuda_matches_the_torch_path(
    num_rows, out_features, in_features, dtype, e8m0
):
    gen = torch.Generator().manual_seed(num_rows)
    weight, scale = quantize_fp8(torch.randn(out_features, in_features, generator=gen))
    if e8m0:
        scale = torch.randint(110, 130, scale.shape, generator=gen, dtype=torch.uint8)
    x = torch.randn(num_rows, in_features, generator=gen).to(dtype)
    weight, scale, x = weight.to(CUDA), scale.to(CUDA), x.to(CUDA)
    got = fp8_linear(x, weight, scale)
    _assert_matches(got, fp8_block_linear_reference(x, weight, scale))


@pytest.mark.parametrize(
    ("counts", "out_features", "in_features", "dtype"),
    [
        ([0, 5, 0, 40, 1, 0], 70, 96, torch.float32),
        ([130, 2, 0, 9], 64, 160, torch.float32),
        ([3, 0, 0, 0, 0, 0, 0, 4], 33, 32, torch.bfloat16),
        ([0] * 20 + [200] + [1] * 11, 256, 512, torch.bfloat16),  # 32 experts, one busy
    ],
)
def test_fp4_grouped_on_cuda_matches_the_torch_path(counts, out_features, in_features, dtype):
    gen = torch.Generator().manual_seed(len(counts))
    w = torch.randn(len(counts), out_features, in_features, generator=gen)
    weight, scale = quantize_fp4(w)
    scale = scale + torch.randint(0, 6, scale.shape, generator=gen, dtype=torch.uint8)
    x = torch.randn(sum(counts), in_features, generator=gen).to(dtype)
    offsets = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()])
    weight, scale, x, offsets = (t.to(CUDA) for t in (weight, scale, x, offsets))
    got = fp4_grouped(x, offsets, weight, scale)
    _assert_matches(got, fp4_grouped_matmul_reference(x, offsets, weight, scale))
