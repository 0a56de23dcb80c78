"""Weight-only quantized linear layers on torch's own CPU kernels, swapped in at load.

EngineConfig(weights=...) picks the format (config.WEIGHT_FORMATS):
- "int8": symmetric per output channel, scale = max|w| / 127 over the row, codes in [-127, 127];
  decode rows go through `aten._weight_int8pack_mm`.
- "int4": asymmetric groups of 32 along the input dimension (the GGUF Q4_0/Q4_1/Q4_K block
  size), w ≈ (code - 8) * scale + zero with code in [0, 15], scale = (max - min) / 15 and
  zero = min + 8 * scale per group; decode rows go through `aten._weight_int4pack_mm_for_cpu`.

The codes are re-quantized from the GGUF's dequantized fp32 values: the kernels want their own
packed layouts. For a Q4_1 tensor (SmolLM2's projections: 32 weights, a scale and a min per
block, the codes spanning 0..15) the int4 groups are the file's blocks and the re-quantized
codes are exactly the file's (checked: zero error in fp32); the kernel then holds scale and
zero in bf16. Q4_K (Gemma 3) has 6-bit sub-block scales: re-quantized, not exact. The output
head is int8 in both formats (the file keeps it at 8 bits: Q8_0 for SmolLM2).

Both kernels are fast only with bf16 activations on this AVX2 CPU (fp32 activations take a
slow path, ~5-20× slower), so decode rows go in as bf16 and come out fp32.
At prefill sizes the kernels lose to fp32 GEMM by 4-30× (measured, docs/PERFORMANCE.md), so a
batch of more than MAX_KERNEL_ROWS rows runs fp32 GEMM over the codes dequantized a tile of rows
at a time into one reused buffer (tiled_linear.py), never the whole fp32 weight at once: prefill
reads the same quantized weights, and its output is F.linear's on `dequantized()`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.models.tiled_linear import tiled_linear

INT4_GROUP_SIZE = 32
# Rows up to this go through the quantized kernel (decode steps: a row per sequence, plus the
# tokens jump-forward appended); more rows (prefill chunks) dequantize and use fp32 GEMM. The
# kernels' cost grows with the rows (~4-5x fp32 GEMM at 64 rows), the dequantization's does not.
MAX_KERNEL_ROWS = 32
# Those more rows multiply tiles of this many weight values (16 MB of fp32; TILE_VALUES, 1 MB,
# is sized for the few rows of a decode step). A prefill chunk's GEMM is compute-bound, so its
# tile need not stay in L2, and 1 MB tiles cut it into many small GEMMs, each a parallel region
# both threads must reach: on the 2-core host at load 4-5, one SmolLM2-135M layer's projections
# at 1,024 rows took 1.5-1.8x as long with 1 MB tiles as with 16 MB ones (at load 1.5, within 5%).
PREFILL_TILE_VALUES = 1 << 22


class QuantizedLinear(nn.Module):
    """y = x @ dequant(codes).T, the codes held as int8 (one byte a weight, for the dequantized
    path) plus the kernel's own packed copy for int4."""

    def __init__(self, weight: torch.Tensor, fmt: str, max_kernel_rows: int = MAX_KERNEL_ROWS):
        super().__init__()
        if fmt not in ("int8", "int4"):
            raise ValueError(f"QuantizedLinear format must be 'int8' or 'int4', got {fmt!r}")
        out_features, in_features = weight.shape
        self.fmt = fmt
        self.in_features, self.out_features = in_features, out_features
        self.max_kernel_rows = max_kernel_rows
        weight = weight.detach().float()
        if fmt == "int8":
            codes, scales = quantize_int8(weight)
            self.group_size = in_features
            self.register_buffer("codes", codes)  # (N, K) int8
            self.register_buffer("scales", scales)  # (N,) fp32
            self.register_buffer("zeros", torch.zeros_like(scales))
            # Plain attributes, not buffers: Module.to(float32) must not cast them.
            self.kernel_scales = scales.bfloat16()
        else:
            check_int4_shape(out_features, in_features)
            codes, scales, zeros = quantize_int4(weight, INT4_GROUP_SIZE)
            self.group_size = INT4_GROUP_SIZE
            self.register_buffer("codes", codes)  # (N, K) int8, values 0..15
            self.register_buffer("scales", scales)  # (N, K / group) fp32
            self.register_buffer("zeros", zeros)
            # The kernel's layout: packed nibbles, and (K / group, N, 2) scale-and-zero pairs.
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
            self.register_buffer("packed", packed)
            pairs = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous()
            self.kernel_scales = pairs.bfloat16()  # (K / group, N, 2), not cast by .to()

    def dequantized(self) -> torch.Tensor:
        """The fp32 weight the codes stand for, (N, K)."""
        weight = torch.empty(self.out_features, self.in_features, dtype=torch.float32)
        self._dequantize_rows(weight, 0, self.out_features)
        return weight

    def _dequantize_rows(self, tile: torch.Tensor, lo: int, hi: int) -> None:
        """Write rows [lo, hi) of the fp32 weight into `tile` ((hi - lo, K), fp32):
        (code [- 8 for int4]) * scale + zero, group by group."""
        n, g = self.out_features, self.group_size
        groups = tile.view(hi - lo, -1, g)  # (rows, groups, group)
        groups.copy_(self.codes[lo:hi].view(hi - lo, -1, g))  # int8 → fp32
        if self.fmt == "int4":
            groups.sub_(8)
        groups.mul_(self.scales.view(n, -1, 1)[lo:hi]).add_(self.zeros.view(n, -1, 1)[lo:hi])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0] if x.dim() == 2 else x.numel() // x.shape[-1]
        if x.dtype != torch.float32:  # not the engine's (its CPU path is fp32): direct callers
            return F.linear(x, self.dequantized().to(x.dtype))
        flat = x.reshape(rows, self.in_features)
        if rows > self.max_kernel_rows:
            out = tiled_linear(
                flat,
                self.out_features,
                self.in_features,
                self._dequantize_rows,
                PREFILL_TILE_VALUES,
            )
        elif self.fmt == "int8":
            out = torch.ops.aten._weight_int8pack_mm(
                flat.bfloat16(), self.codes, self.kernel_scales
            )
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(
                flat.bfloat16(), self.packed, self.group_size, self.kernel_scales
            )
        return out.float().reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, fmt={self.fmt}"


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: (codes (N, K) int8, scales (N,))."""
    scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)
    codes = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return codes.contiguous(), scales


def quantize_int4(
    weight: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric int4 in groups along K: (codes (N, K) int8 in 0..15, scales and zeros
    (N, K / group)), w ≈ (code - 8) * scale + zero."""
    n, k = weight.shape
    groups = weight.view(n, k // group_size, group_size)  # (N, groups, group)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scales = ((high - low) / 15).clamp(min=1e-12)
    codes = torch.round((groups - low[..., None]) / scales[..., None]).clamp(0, 15)
    zeros = low + 8 * scales
    return codes.to(torch.int8).view(n, k).contiguous(), scales, zeros


def check_int4_shape(out_features: int, in_features: int) -> None:
    if in_features % INT4_GROUP_SIZE or out_features % 16:
        raise ValueError(
            f"int4 weights need in_features divisible by {INT4_GROUP_SIZE} and out_features by "
            f"16 (the kernel's tile), got ({out_features}, {in_features}); use weights='int8'"
        )


# The projections quantized in every supported model (llama family, Gemma 3).
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def quantize_model(model: nn.Module, fmt: str, lm_head: bool = True) -> int:
    """Quantize a model's projections to `fmt` and, with `lm_head`, its output head to int8
    (GGUF files keep the head/embedding at 8 bits or more, e.g. SmolLM2's Q8_0: int4 there
    would lose what the file has). A head tied to the embedding (a TiedLMHead: Gemma 3)
    gets a quantized copy of the embedding; the embedding itself stays fp32 (a lookup reads one
    row a token). Returns how many layers were quantized."""
    count = quantize_linears(model, fmt, PROJECTIONS)
    if fmt == "fp32" or not lm_head:
        return count
    count += quantize_linears(model, "int8", ("lm_head",))
    if getattr(getattr(model, "lm_head", None), "tied", False):
        model.lm_head = QuantizedLinear(model.embed_tokens.weight, "int8")
        count += 1
    return count


def quantize_linears(model: nn.Module, fmt: str, names: tuple[str, ...]) -> int:
    """Replace every nn.Linear whose attribute name is in `names` (e.g. qkv_proj) with a
    QuantizedLinear of `fmt`; returns how many were replaced. "fp32" replaces none."""
    if fmt == "fp32":
        return 0
    targets = [
        (parent, attr, child)
        for parent in model.modules()
        for attr, child in parent.named_children()
        if attr in names and isinstance(child, nn.Linear)
    ]
    for parent, attr, child in targets:
        if child.bias is not None:
            raise ValueError(f"{attr} has a bias; QuantizedLinear takes bias-free layers only")
        setattr(parent, attr, QuantizedLinear(child.weight, fmt))
    return len(targets)
