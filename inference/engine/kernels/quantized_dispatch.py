"""The packed weights' matmuls as a model calls them: on CUDA the triton kernels of
quantized_matmul.py (tiles dequantized in registers); anywhere else the torch path here, which
dequantizes with models/packed/formats.py and multiplies in fp32. The torch path is also the
kernels' reference. This module imports triton only when a CUDA tensor arrives, so the CPU
engine never needs it.
"""

from __future__ import annotations

from itertools import pairwise

import torch

from inference.engine.models.packed.formats import FP8_BLOCK, dequantize_fp4, dequantize_fp8


def uses_kernels(device: torch.device) -> bool:
    """CUDA runs the kernels; the CPU runs the torch path (the interpreter is for tests)."""
    return device.type == "cuda"


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: int = FP8_BLOCK
) -> torch.Tensor:
    """(M, N) fp32 = x (M, K) @ dequantize_fp8(weight (N, K), scale, block).T"""
    if uses_kernels(x.device):
        from inference.engine.kernels.quantized_matmul import fp8_block_linear

        return fp8_block_linear(x, weight, scale, block)
    return fp8_block_linear_reference(x, weight, scale, block)


def fp4_grouped(
    x: torch.Tensor, expert_offsets: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """(T, N) fp32: rows expert_offsets[e]:expert_offsets[e + 1] of x (T, K) @ expert e's
    dequantize_fp4(weight[e] (N, K / 2), scale[e] (N, K / 32)).T"""
    if uses_kernels(x.device):
        from inference.engine.kernels.quantized_matmul import fp4_grouped_matmul

        return fp4_grouped_matmul(x, expert_offsets, weight, scale)
    return fp4_grouped_matmul_reference(x, expert_offsets, weight, scale)


def fp8_block_linear_reference(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: int = FP8_BLOCK
) -> torch.Tensor:
    """The weight dequantized whole (one fp32 copy for the call's duration), then x @ W.T."""
    return x.float() @ dequantize_fp8(weight, scale, block).T


def fp4_grouped_matmul_reference(
    x: torch.Tensor, expert_offsets: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """A loop over the experts that own rows, each dequantized on its own (one expert's fp32
    copy at a time); rows outside every group stay 0."""
    out = torch.zeros(x.shape[0], weight.shape[1], dtype=torch.float32, device=x.device)
    bounds = expert_offsets.tolist()
    for expert, (start, end) in enumerate(pairwise(bounds)):
        if end > start:
            w = dequantize_fp4(weight[expert], scale[expert])  # (N, K)
            out[start:end] = x[start:end].float() @ w.T
    return out
