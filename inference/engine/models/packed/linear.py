"""FP8 block-scaled linear layers held as DeepSeek ships them (formats.py: e4m3 bytes, a scale
per 128 x 128 block), in place of an fp32 nn.Linear.

The bytes are kept under integer dtypes (the weight as uint8, an fp32 scale grid as int32) and
viewed back at use: `Module.to(dtype)` (the runner's cast to the compute dtype) converts every
floating tensor, and must neither widen the FP8 bytes nor round the scales to bf16.

CPU: each call multiplies a tile of rows at a time straight from the FP8 bytes, in fp32
(cpu_tiles), so the output is the one a model holding the dequantized values gives. CUDA:
triton's `fp8_block_linear` (kernels/quantized_matmul.py) dequantizes tiles in registers.
"""

from __future__ import annotations

import torch
from torch import nn

from inference.engine.models.packed.cpu_tiles import fp8_linear
from inference.engine.models.packed.formats import FP8_BLOCK, check_fp8, dequantize_fp8


def store_scale(scale: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(integer storage, is_e8m0): e8m0 bytes stay uint8; float scales become fp32 bits."""
    if scale.dtype == torch.uint8 or str(scale.dtype) == "torch.float8_e8m0fnu":
        return scale.contiguous().view(torch.uint8), True
    return scale.float().contiguous().view(torch.int32), False


class Fp8Linear(nn.Module):
    """y = x · dequantize(weight, scale)ᵀ, for a bias-free (out, in) weight."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        scale_is_e8m0: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        grid = (-(-out_features // FP8_BLOCK), -(-in_features // FP8_BLOCK))
        self.scale_is_e8m0 = scale_is_e8m0
        self.register_buffer(
            "weight", torch.empty(out_features, in_features, dtype=torch.uint8, device=device)
        )
        scale_dtype = torch.uint8 if scale_is_e8m0 else torch.int32
        self.register_buffer("scale", torch.empty(grid, dtype=scale_dtype, device=device))

    @classmethod
    def from_packed(cls, name: str, weight: torch.Tensor, scale: torch.Tensor) -> Fp8Linear:
        """From an FP8 (out, in) weight and its block scales (ValueError naming `name`)."""
        module = cls(weight.shape[1], weight.shape[0], device="meta")
        module.set_packed(name, weight, scale)
        return module

    def set_packed(self, name: str, weight: torch.Tensor, scale: torch.Tensor) -> None:
        """Hold `weight` (FP8, this layer's (out, in)) and its block scales; a single scale
        stands for every block. ValueError naming `name` where they do not fit."""
        check_fp8(name, weight, scale)
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(
                f"{name}: FP8 weight {tuple(weight.shape)}, the model expects "
                f"({self.out_features}, {self.in_features})"
            )
        if scale.numel() == 1:
            grid = (-(-self.out_features // FP8_BLOCK), -(-self.in_features // FP8_BLOCK))
            scale = scale.reshape(1, 1).expand(grid).contiguous()
        self.scale, self.scale_is_e8m0 = store_scale(scale)
        self.weight = weight.contiguous().view(torch.uint8)

    def fp8_weight(self) -> torch.Tensor:
        return self.weight.view(torch.float8_e4m3fn)  # (out, in)

    def scale_grid(self) -> torch.Tensor:
        """The block scales as the kernel takes them: fp32, or e8m0 bytes (uint8)."""
        return self.scale if self.scale_is_e8m0 else self.scale.view(torch.float32)

    def dequantized(self) -> torch.Tensor:
        """(out, in) fp32: the values this layer computes with."""
        return dequantize_fp8(self.fp8_weight(), self.scale_grid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from inference.engine.kernels.quantized_matmul import fp8_block_linear

            rows = x.reshape(-1, self.in_features)  # (M, in)
            out = fp8_block_linear(rows, self.fp8_weight(), self.scale_grid(), block=FP8_BLOCK)
            return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        rows = x.reshape(-1, self.in_features).float()
        out = fp8_linear(rows, self.fp8_weight(), self.scale_grid())
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        kind = "e8m0" if self.scale_is_e8m0 else "fp32"
        return f"in_features={self.in_features}, out_features={self.out_features}, scale={kind}"


class Fp8GroupedLinear(Fp8Linear):
    """attention.GroupedLinear's block-diagonal projection over a packed weight: each of
    n_groups head groups times its own out / n_groups rows."""

    def __init__(self, in_per_group: int, out_features: int, n_groups: int, **kwargs) -> None:
        super().__init__(in_per_group, out_features, **kwargs)
        self.n_groups = n_groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, groups, in) → (T, groups · out)
        rows_per_group = self.out_features // self.n_groups
        if x.is_cuda and rows_per_group % FP8_BLOCK == 0:
            from inference.engine.kernels.quantized_matmul import fp8_block_linear

            weight, scale = self.fp8_weight(), self.scale_grid()
            step = rows_per_group // FP8_BLOCK
            outs = [
                fp8_block_linear(
                    x[:, g],
                    weight[g * rows_per_group : (g + 1) * rows_per_group],
                    scale[g * step : (g + 1) * step],
                    block=FP8_BLOCK,
                )
                for g in range(self.n_groups)
            ]
            return torch.cat(outs, dim=-1).to(x.dtype)  # (T, groups · out)
        if x.is_cuda:
            w = self.dequantized().to(x.dtype)
            w = w.view(self.n_groups, -1, x.shape[-1]).transpose(1, 2)  # (G, in, out/G)
            return torch.bmm(x.transpose(0, 1), w).transpose(0, 1).flatten(1)
        weight, scale = self.fp8_weight(), self.scale_grid()
        groups = [range(g * rows_per_group, (g + 1) * rows_per_group) for g in range(self.n_groups)]
        outs = [fp8_linear(x[:, g].float(), weight, scale, rows) for g, rows in enumerate(groups)]
        return torch.cat(outs, dim=-1).to(x.dtype)  # (T, groups · out)
