"""The packed weights' matmuls off CUDA: the torch path, in a process without the triton
interpreter (where the kernels would refuse CPU tensors), equal to a matmul of the dequantized
weights. The kernels themselves are checked in kernels/ and test_gpu_quantized_matmul.py."""

import torch

from inference.engine.kernels.quantized_dispatch import fp4_grouped, fp8_linear, uses_kernels
from inference.engine.models.packed.formats import (
    dequantize_fp4,
    dequantize_fp8,
    quantize_fp4,
    quantize_fp8,
)


def test_cpu_tensors_take_the_torch_path_and_cuda_the_kernels():
    assert not uses_kernels(torch.device("cpu")) and uses_kernels(torch.device("cuda", 0))


def test_fp8_linear_on_cpu_is_x_times_the_dequantized_weight():
    gen = torch.Generator().manual_seed(0)
    weight, scale = quantize_fp8(torch.randn(150, 200, generator=gen))
    x = torch.randn(7, 200, generator=gen).bfloat16()
    got = fp8_linear(x, weight, scale)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, x.float() @ dequantize_fp8(weight, scale).T)


def test_fp4_grouped_on_cpu_multiplies_each_experts_rows_by_its_weight():
    gen = torch.Generator().manual_seed(1)
    weight, scale = quantize_fp4(torch.randn(3, 40, 64, generator=gen))
    x = torch.randn(9, 64, generator=gen)
    offsets = torch.tensor([0, 4, 4, 8])  # expert 1 empty, row 8 in no group
    got = fp4_grouped(x, offsets, weight, scale)
    for expert, rows in ((0, slice(0, 4)), (2, slice(4, 8))):
        want = x[rows] @ dequantize_fp4(weight[expert], scale[expert]).T
        torch.testing.assert_close(got[rows], want)
    assert (got[8] == 0).all()
