"""DeepSeek-V4's MLP: routed experts (top-k of sqrt-softplus scores with a correction bias, or
hash-routed by token id in the first layers) plus a shared expert, SwiGLU clamped. Both routings
give (token, slot) expert ids that one grouped computation serves (grouped_experts)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.models.deepseek_v4.config import DeepseekV4Config
from inference.engine.models.grouped_experts import (
    dense_is_cheaper,
    dense_swiglu,
    group_by_expert,
    grouped_swiglu,
)

# ---- MoE --------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, limit: float) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x).clamp(max=self.limit)
        up = self.up_proj(x).clamp(min=-self.limit, max=self.limit)
        return self.down_proj(F.silu(gate) * up)


class Experts(nn.Module):
    """The routed experts as dense (experts, out, in) tensors: `expert_ids` is the range of the
    model's experts held (all, or one rank's share); packed.experts.Fp4Experts is the packed
    form with the same interface."""

    def __init__(self, config: DeepseekV4Config, expert_ids: range | None = None) -> None:
        super().__init__()
        self.expert_ids = expert_ids if expert_ids is not None else range(config.num_experts)
        e, d, i = len(self.expert_ids), config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.zeros(e, 2 * i, d))
        self.down_proj = nn.Parameter(torch.zeros(e, d, i))
        self.limit = config.swiglu_limit

    def sliced(self, expert_ids: range) -> Experts:
        """The experts `expert_ids` (within these) as a module of their own (copies)."""
        lo, hi = expert_ids.start - self.expert_ids.start, expert_ids.stop - self.expert_ids.start
        if lo < 0 or hi > len(self.expert_ids):
            raise ValueError(f"experts {expert_ids} are not all held here ({self.expert_ids})")
        out = Experts.__new__(Experts)
        nn.Module.__init__(out)
        out.expert_ids, out.limit = expert_ids, self.limit
        out.gate_up_proj = nn.Parameter(self.gate_up_proj.data[lo:hi].clone())
        out.down_proj = nn.Parameter(self.down_proj.data[lo:hi].clone())
        return out

    def forward(
        self, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """The weighted sum over each token's experts held here (others contribute 0), one
        grouped computation, or every expert on every token where that wastes little
        (grouped_experts)."""
        gate_up, down = self.gate_up_proj, self.down_proj
        size = gate_up[0].numel() + down[0].numel()
        if dense_is_cheaper(x.shape[0], indices.shape[1], len(self.expert_ids), size):
            return dense_swiglu(
                x, indices, weights, self.expert_ids, gate_up, down, self.limit, x.dtype
            )
        groups = group_by_expert(indices, weights, self.expert_ids)
        return grouped_swiglu(x, groups, gate_up, down, self.limit, x.dtype)


class Router(nn.Module):
    """Expert weights from the learned gate; the experts themselves by top-k of the scores
    (plus a correction bias), or — in hash layers — by a fixed token-id table."""

    def __init__(self, config: DeepseekV4Config, is_hash: bool) -> None:
        super().__init__()
        self.top_k, self.scoring = config.num_experts_per_tok, config.scoring_func
        self.scaling = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))
        self.is_hash = is_hash
        if is_hash:
            self.register_buffer(
                "tid2eid", torch.zeros(config.vocab_size, self.top_k, dtype=torch.long)
            )
        else:
            self.register_buffer("e_score_correction_bias", torch.zeros(config.num_experts))

    def forward(
        self, x: torch.Tensor, input_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x, self.weight)
        if self.scoring == "sqrtsoftplus":
            scores = F.softplus(logits).sqrt()
        elif self.scoring == "softmax":
            scores = logits.softmax(dim=-1)
        else:
            scores = logits.sigmoid()
        if self.is_hash:
            indices = self.tid2eid[input_ids].long()
        else:
            biased = scores + self.e_score_correction_bias
            indices = torch.topk(biased, self.top_k, dim=-1, sorted=False).indices
        weights = scores.gather(1, indices)
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return indices, weights * self.scaling


class MoE(nn.Module):
    def __init__(self, config: DeepseekV4Config, is_hash: bool) -> None:
        super().__init__()
        self.gate = Router(config, is_hash)
        self.experts = Experts(config)
        self.shared_experts = MLP(
            config.hidden_size, config.moe_intermediate_size, config.swiglu_limit
        )

    def forward(self, x: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        indices, weights = self.gate(x, input_ids)
        return self.experts(x, indices, weights) + self.shared_experts(x)
