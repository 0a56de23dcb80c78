"""The byte layouts of DeepSeek's packed weights, and the pure torch functions that check,
dequantize and (for tests and benches that build checkpoints) quantize them.

- FP8: e4m3 (`torch.float8_e4m3fn`, one byte a weight), a scale per FP8_BLOCK x FP8_BLOCK block
  of the (out, in) weight (DeepSeek's `.scale` / `.weight_scale_inv`: value = fp8 * scale). The
  grid is (ceil(out / 128), ceil(in / 128)): edge blocks are partial. Scales are fp32 (or bf16),
  or e8m0 exponent bytes (uint8, 2 ** (byte - 127)).
- FP4: e2m1, two a byte, low nibble first (the byte holds inputs 2j and 2j + 1 of a row), so a
  (out, in) weight is (out, in / 2) bytes; an e8m0 scale byte per FP4_GROUP inputs of a row,
  (out, in / 32). Routed experts stack these: (experts, out, in / 2), (experts, out, in / 32).
"""

from __future__ import annotations

import math

import torch

FP8_BLOCK = 128
FP4_GROUP = 32
FP8_MAX = 448.0  # the largest finite e4m3fn value
FP4_MAX = 6.0
# e2m1 code → value: bit 3 the sign, bits 0-2 the magnitude's index.
E2M1_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)


def is_fp4(tensor: torch.Tensor) -> bool:
    """Packed FP4 bytes: int8 / uint8 (as safetensors stores them) or torch's float4 pair type."""
    return (
        tensor.dtype in (torch.int8, torch.uint8) or str(tensor.dtype) == "torch.float4_e2m1fn_x2"
    )


def is_fp8(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() and tensor.element_size() == 1


def fp8_scale_grid(out_features: int, in_features: int, block: int = FP8_BLOCK) -> tuple[int, int]:
    return math.ceil(out_features / block), math.ceil(in_features / block)


def check_fp8(name: str, weight: torch.Tensor, scale: torch.Tensor, block: int = FP8_BLOCK) -> None:
    """ValueError naming the tensor unless weight is (..., out, in) FP8 and scale its block grid."""
    if not is_fp8(weight):
        raise ValueError(f"{name}: expected an FP8 (e4m3) weight, got {weight.dtype}")
    want = (*weight.shape[:-2], *fp8_scale_grid(*weight.shape[-2:], block))
    if tuple(scale.shape) != want and scale.numel() != 1:
        raise ValueError(
            f"{name}: its scale grid {tuple(scale.shape)} does not divide its weight "
            f"{tuple(weight.shape)} into {block} x {block} blocks (expected {want})"
        )


def check_fp4(name: str, packed: torch.Tensor, scale: torch.Tensor, group: int = FP4_GROUP) -> None:
    """ValueError naming the tensor unless packed is (..., out, in / 2) bytes and scale
    (..., out, in / group) e8m0 bytes."""
    if not is_fp4(packed):
        raise ValueError(f"{name}: expected packed FP4 bytes, got {packed.dtype}")
    in_features = 2 * packed.shape[-1]
    if in_features % group:
        raise ValueError(
            f"{name}: {in_features} FP4 inputs a row ({packed.shape[-1]} bytes) is not a "
            f"multiple of the scale group {group}"
        )
    want = (*packed.shape[:-1], in_features // group)
    if tuple(scale.shape) != want:
        raise ValueError(
            f"{name}: its scale has shape {tuple(scale.shape)}; a packed FP4 weight "
            f"{tuple(packed.shape)} needs one e8m0 byte per {group} inputs: {want}"
        )
    if scale.dtype not in (torch.uint8, torch.int8) and str(scale.dtype) != "torch.float8_e8m0fnu":
        raise ValueError(f"{name}: FP4 scales must be e8m0 bytes (uint8), got {scale.dtype}")


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """An e8m0 exponent byte b → 2 ** (b - 127), in fp32."""
    return (scale.contiguous().view(torch.uint8).float() - 127.0).exp2()


def scale_to_float(scale: torch.Tensor) -> torch.Tensor:
    """A scale tensor as fp32: e8m0 bytes expanded, floats widened."""
    if scale.dtype == torch.uint8 or str(scale.dtype) == "torch.float8_e8m0fnu":
        return e8m0_to_float(scale)
    return scale.float()


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Two e2m1 values per byte, low nibble first → fp32, the last dim twice as wide."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    u8 = packed.contiguous().view(torch.uint8)
    pairs = torch.stack([table[(u8 & 0xF).long()], table[(u8 >> 4).long()]], dim=-1)
    return pairs.reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def dequantize_fp8(
    weight: torch.Tensor, scale: torch.Tensor, block: int = FP8_BLOCK
) -> torch.Tensor:
    """fp32 (..., out, in) = FP8 value x its block's scale (edge blocks partial)."""
    scale = scale_to_float(scale)
    if scale.numel() == 1:
        return weight.float() * scale.reshape(())
    rows, cols = weight.shape[-2:]
    expanded = scale.repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)
    return weight.float() * expanded[..., :rows, :cols]


def dequantize_fp4(
    packed: torch.Tensor, scale: torch.Tensor, group: int = FP4_GROUP
) -> torch.Tensor:
    """fp32 (..., out, in) = e2m1 value x its group's e8m0 scale."""
    values = unpack_fp4(packed)
    return values * scale_to_float(scale).repeat_interleave(group, dim=-1)


def quantize_fp8(weight: torch.Tensor, block: int = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 weight, fp32 scale grid) for a float (out, in) weight: each block's largest magnitude
    maps to FP8_MAX. For building checkpoints in tests and benches."""
    rows, cols = weight.shape
    grid_rows, grid_cols = fp8_scale_grid(rows, cols, block)
    padded = weight.new_zeros(grid_rows * block, grid_cols * block, dtype=torch.float32)
    padded[:rows, :cols] = weight.float()
    blocks = padded.reshape(grid_rows, block, grid_cols, block)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    expanded = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:rows, :cols]
    return (weight.float() / expanded).to(torch.float8_e4m3fn), scale


def quantize_fp4(weight: torch.Tensor, group: int = FP4_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 (..., out, in / 2), e8m0 uint8 (..., out, in / group)) for a float
    (..., out, in) weight: each group's scale the power of two that brings its largest magnitude
    within FP4_MAX, each value rounded to the nearest e2m1. For tests and benches."""
    *lead, cols = weight.shape
    if cols % group:
        raise ValueError(f"FP4 needs the input width ({cols}) to be a multiple of {group}")
    groups = weight.float().reshape(*lead, cols // group, group)
    amax = groups.abs().amax(dim=-1)
    exponent = torch.where(amax > 0, torch.ceil(torch.log2(amax / FP4_MAX)), torch.zeros_like(amax))
    exponent = exponent.clamp(-127, 127)
    scaled = (groups / exponent.exp2().unsqueeze(-1)).reshape(*lead, cols)
    magnitudes = torch.tensor(E2M1_VALUES[:8], device=weight.device)
    index = (scaled.abs().unsqueeze(-1) - magnitudes).abs().argmin(dim=-1)
    codes = index | ((scaled < 0) & (index > 0)).long() << 3
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return packed, (exponent + 127).to(torch.uint8)
