"""A layer's routed experts held as DeepSeek ships them: FP4 e2m1 (two a byte, low nibble first)
with an e8m0 scale per 32 inputs (formats.py), one packed tensor per projection for all the
experts this rank holds, not a module per expert:

    gate_up        (experts, 2 · intermediate, hidden / 2)    rows: w1 (gate) then w3 (up)
    gate_up_scale  (experts, 2 · intermediate, hidden / 32)
    down           (experts, hidden, intermediate / 2)        w2
    down_scale     (experts, hidden, intermediate / 32)

`expert_ids` is the contiguous range of the model's experts held here (all of them, or one
rank's share under expert parallelism); tokens routed elsewhere are another rank's to compute.

CPU: each expert the step routes to, in turn, multiplied a tile of rows at a time straight from
its packed bytes (cpu_tiles; the output a model holding the dequantized values gives).
CUDA: the tokens sorted by expert and two launches of triton's `fp4_grouped_matmul`
(kernels/quantized_matmul.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.models.grouped_experts import (
    clamped_swiglu,
    group_by_expert,
    swiglu_per_expert,
)
from inference.engine.models.packed.cpu_tiles import fp4_linear
from inference.engine.models.packed.formats import FP4_GROUP, check_fp4, dequantize_fp4

PROJECTIONS = ("w1", "w3", "w2")  # DeepSeek's per-expert names: gate, up, down


class Fp4Experts(nn.Module):
    def __init__(
        self,
        hidden: int,
        intermediate: int,
        limit: float,
        expert_ids: range,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        for what, width in (("hidden_size", hidden), ("moe_intermediate_size", intermediate)):
            if width % FP4_GROUP:
                raise ValueError(
                    f"FP4 experts need {what} ({width}) to be a multiple of {FP4_GROUP}"
                )
        self.hidden, self.intermediate, self.limit = hidden, intermediate, limit
        self.expert_ids = expert_ids
        n = len(expert_ids)

        def empty(*shape: int) -> torch.Tensor:
            return torch.empty(shape, dtype=torch.uint8, device=device)

        self.register_buffer("gate_up", empty(n, 2 * intermediate, hidden // 2))
        self.register_buffer("gate_up_scale", empty(n, 2 * intermediate, hidden // FP4_GROUP))
        self.register_buffer("down", empty(n, hidden, intermediate // 2))
        self.register_buffer("down_scale", empty(n, hidden, intermediate // FP4_GROUP))

    def set_projection(
        self, name: str, expert: int, which: str, packed: torch.Tensor, scale: torch.Tensor
    ) -> None:
        """Copy expert `expert`'s (a model-wide id, held here) `which` ∈ w1/w3/w2 in place;
        ValueError naming `name` where the bytes or scales do not fit."""
        check_fp4(name, packed, scale)
        local = expert - self.expert_ids.start
        i = self.intermediate
        weight, scales, rows = {
            "w1": (self.gate_up, self.gate_up_scale, slice(0, i)),
            "w3": (self.gate_up, self.gate_up_scale, slice(i, 2 * i)),
            "w2": (self.down, self.down_scale, slice(None)),
        }[which]
        want = tuple(weight[local, rows].shape)
        if tuple(packed.shape) != want:
            raise ValueError(
                f"{name}: packed FP4 {tuple(packed.shape)}, the model expects {want} "
                f"(out, in / 2) bytes"
            )
        weight[local, rows].copy_(packed.view(torch.uint8))
        scales[local, rows].copy_(scale.view(torch.uint8))

    def sliced(self, expert_ids: range) -> Fp4Experts:
        """The experts `expert_ids` (within these) as a module of their own (copies)."""
        lo, hi = expert_ids.start - self.expert_ids.start, expert_ids.stop - self.expert_ids.start
        if lo < 0 or hi > len(self.expert_ids):
            raise ValueError(f"experts {expert_ids} are not all held here ({self.expert_ids})")
        out = Fp4Experts(self.hidden, self.intermediate, self.limit, expert_ids, device="meta")
        for name in ("gate_up", "gate_up_scale", "down", "down_scale"):
            setattr(out, name, getattr(self, name)[lo:hi].clone())
        return out

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 (gate_up (n, 2I, D), down (n, D, I)): the values these experts compute with."""
        return (
            dequantize_fp4(self.gate_up, self.gate_up_scale),
            dequantize_fp4(self.down, self.down_scale),
        )

    def forward(
        self,
        x: torch.Tensor,  # (T, hidden)
        indices: torch.Tensor,  # (T, top_k) expert ids, model-wide
        weights: torch.Tensor,  # (T, top_k)
    ) -> torch.Tensor:
        """The weighted sum over each token's experts held here (others contribute 0)."""
        if x.is_cuda:
            return self._grouped(x, indices, weights)
        groups = group_by_expert(indices, weights, self.expert_ids)
        out = swiglu_per_expert(x, groups, self._gate_up, self._down, self.limit)
        return out.to(x.dtype)

    def _gate_up(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        return fp4_linear(x, self.gate_up[expert], self.gate_up_scale[expert])

    def _down(self, expert: int, h: torch.Tensor) -> torch.Tensor:
        return fp4_linear(h, self.down[expert], self.down_scale[expert])

    def _grouped(self, x, indices, weights) -> torch.Tensor:
        from inference.engine.kernels.quantized_matmul import fp4_grouped_matmul

        top_k = indices.shape[1]
        flat = indices.flatten()  # (T · top_k,)
        held = (flat >= self.expert_ids.start) & (flat < self.expert_ids.stop)
        pairs = held.nonzero().squeeze(1)  # (P,) (token, slot) pairs routed here
        local = flat[pairs] - self.expert_ids.start
        order = torch.argsort(local, stable=True)
        pairs, local = pairs[order], local[order]  # sorted by expert
        counts = torch.bincount(local, minlength=len(self.expert_ids))
        offsets = F.pad(counts.cumsum(0), (1, 0))  # (experts + 1,)
        tokens = pairs // top_k
        h = fp4_grouped_matmul(x[tokens], offsets, self.gate_up, self.gate_up_scale)  # (P, 2I)
        h = clamped_swiglu(h, self.limit)
        y = fp4_grouped_matmul(h.to(x.dtype), offsets, self.down, self.down_scale)  # (P, D)
        y = y * weights.flatten()[pairs, None].float()
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        return out.index_add_(0, tokens, y).to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"experts={self.expert_ids.start}..{self.expert_ids.stop - 1}, hidden={self.hidden}, "
            f"intermediate={self.intermediate}, fp4"
        )
