"""Routed experts as one grouped computation: the step's (token, slot) pairs routed to the
experts held here, sorted by expert and padded to (experts hit, most pairs an expert got,
hidden); gate/up as one batched matmul, SwiGLU with V4's clamp, down as another, then each
pair's output weighted and summed into its token (index_add).

Dense experts (moe.Experts): `grouped_swiglu` takes the experts hit in chunks whose weights
stay under WEIGHT_BUDGET values, so a prefill that routes to every expert of a large model
never copies all of them at once; a decode step is one chunk, its weights a view of the span
of experts hit where they are dense in it. Packed experts
on the CPU (packed.experts.Fp4Experts) are never had whole: `swiglu_per_expert` hands each
expert's rows to the caller's matmuls, which read the packed bytes a tile at a time
(packed/cpu_tiles.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Most weight values (gate/up and down together) one chunk of experts holds at once: 512 MB fp32.
WEIGHT_BUDGET = 1 << 27

# A step whose every-expert-on-every-token products waste fewer multiply-adds than this runs
# them so (dense_swiglu): ~15 ops where grouping takes ~60, and on the CPU an op costs about
# what a few hundred thousand multiply-adds do. The tiny V4 at decode (8 tokens, 8 experts of
# 24,576 each, top 2) wastes 1.2 M; a model of real size never comes near.
DENSE_WASTE_BUDGET = 1 << 21

# A chunk whose padding (capacity · experts − pairs rows) wastes more multiply-adds than this
# per expert hit runs expert by expert instead (~6 ops an expert, no padding): a prefill chunk
# of the tiny V4, whose random routing gives one expert 2-3× another's pairs, computed 2.5×
# its pairs' rows padded (`python -m benchmarks v4-ops` times both on a 1,024-token chunk).
PADDING_WASTE_BUDGET = 6 << 18


def dense_is_cheaper(num_tokens: int, top_k: int, num_experts: int, expert_size: int) -> bool:
    """Whether the step's wasted multiply-adds (experts not routed to) stay under the budget."""
    return num_tokens * max(0, num_experts - top_k) * expert_size <= DENSE_WASTE_BUDGET


@dataclass(frozen=True, slots=True)
class ExpertGroups:
    """The pairs routed to the experts held here, sorted by expert (P pairs, G experts hit)."""

    tokens: torch.Tensor  # (P,) each pair's token
    weights: torch.Tensor  # (P,) each pair's routing weight
    experts: torch.Tensor  # (G,) the experts hit, local ids, ascending
    counts: torch.Tensor  # (G,) pairs each got
    ranks: torch.Tensor  # (P,) each pair's place among its expert's pairs


def group_by_expert(
    indices: torch.Tensor,  # (T, top_k) model-wide expert ids
    weights: torch.Tensor,  # (T, top_k)
    expert_ids: range,  # the experts held here
) -> ExpertGroups:
    top_k = indices.shape[1]
    flat = indices.flatten()  # (T · top_k,)
    held = (flat >= expert_ids.start) & (flat < expert_ids.stop)
    pairs = held.nonzero().squeeze(1)  # (P,) routed here: other ranks' contribute nothing
    local, order = torch.sort(flat[pairs] - expert_ids.start, stable=True)
    pairs = pairs[order]
    experts, group, counts = torch.unique_consecutive(
        local, return_inverse=True, return_counts=True
    )
    ranks = torch.arange(len(pairs), device=pairs.device) - (counts.cumsum(0) - counts)[group]
    return ExpertGroups(pairs // top_k, weights.flatten()[pairs], experts, counts, ranks)


def grouped_swiglu(
    x: torch.Tensor,  # (T, hidden)
    groups: ExpertGroups,
    gate_up: torch.Tensor,  # (E, 2I, hidden): the experts held, by local id
    down: torch.Tensor,  # (E, hidden, I)
    limit: float,
    dtype: torch.dtype,  # what the matmuls compute in
) -> torch.Tensor:
    """(T, hidden) in `dtype`: Σ over each token's pairs of weight · down(SwiGLU(gate_up(x))).

    A chunk whose experts hit span at most twice their number (a decode step of a model with
    few experts: most are hit) reads the span's weights as a view, the experts not hit in it
    computing zero rows; a sparser chunk copies the experts hit out (index), which at a
    decode step cost more than the matmuls themselves. A chunk whose padding would waste
    more than PADDING_WASTE_BUDGET an expert (a prefill's uneven routing) runs expert by
    expert on its sorted rows instead."""
    out = torch.zeros(x.shape, dtype=dtype, device=x.device)
    num_hit = len(groups.experts)
    if num_hit == 0:
        return out
    expert_size = gate_up[0].numel() + down[0].numel()
    per_chunk = max(1, WEIGHT_BUDGET // expert_size)
    pair_starts = F.pad(groups.counts.cumsum(0), (1, 0)).tolist()
    hit = groups.experts.tolist()
    for lo in range(0, num_hit, per_chunk):  # one chunk at decode sizes
        hi = min(lo + per_chunk, num_hit)
        pairs = slice(pair_starts[lo], pair_starts[hi])
        tokens = groups.tokens[pairs]
        counts = groups.counts[lo:hi]
        capacity = int(counts.max())
        first, span = hit[lo], hit[hi - 1] - hit[lo] + 1
        as_view = span <= 2 * (hi - lo)  # the span's weights as a view
        num_slots = span if as_view else hi - lo
        padding = num_slots * capacity - (pairs.stop - pairs.start)
        if padding * expert_size > PADDING_WASTE_BUDGET * (hi - lo):
            starts = [start - pairs.start for start in pair_starts[lo : hi + 1]]
            y = _expert_by_expert(
                x[tokens].to(dtype),
                starts,
                hit[lo:hi],
                lambda expert, rows: F.linear(rows, gate_up[expert].to(dtype)),
                lambda expert, h: F.linear(h, down[expert].to(dtype)),
                limit,
            )
        else:
            experts = groups.experts[lo:hi]
            if as_view:
                slots = experts - first
                gate_up_w, down_w = gate_up[first : first + span], down[first : first + span]
            else:
                slots = torch.arange(hi - lo, device=x.device)
                gate_up_w, down_w = gate_up[experts], down[experts]
            places = slots.repeat_interleave(counts) * capacity + groups.ranks[pairs]  # (P,)
            rows = x.new_zeros(num_slots * capacity, x.shape[1], dtype=dtype)
            rows[places] = x[tokens].to(dtype)
            h = torch.bmm(rows.view(num_slots, capacity, -1), gate_up_w.to(dtype).transpose(1, 2))
            h = clamped_swiglu(h, limit)  # (slots, C, I)
            y = torch.bmm(h, down_w.to(dtype).transpose(1, 2)).flatten(0, 1)[places]  # (P, hidden)
        out.index_add_(0, tokens, y * groups.weights[pairs, None].to(dtype))
    return out


def _expert_by_expert(
    rows: torch.Tensor,  # (P, hidden): the pairs' inputs, sorted by expert
    starts: list[int],  # G + 1: each expert's first pair in rows, then P
    experts: list[int],  # G: the experts hit, local ids
    gate_up: Callable[[int, torch.Tensor], torch.Tensor],  # (expert, (n, hidden)) → (n, 2I)
    down: Callable[[int, torch.Tensor], torch.Tensor],  # (expert, (n, I)) → (n, hidden)
    limit: float,
) -> torch.Tensor:
    """(P, hidden): each pair's expert output, one expert's contiguous rows at a time."""
    y = torch.empty_like(rows)
    for expert, lo, hi in zip(experts, starts, starts[1:], strict=False):
        y[lo:hi] = down(expert, clamped_swiglu(gate_up(expert, rows[lo:hi]), limit))
    return y


def dense_swiglu(
    x: torch.Tensor,  # (T, hidden)
    indices: torch.Tensor,  # (T, top_k) model-wide expert ids
    weights: torch.Tensor,  # (T, top_k)
    expert_ids: range,  # the experts held here
    gate_up: torch.Tensor,  # (E, 2I, hidden)
    down: torch.Tensor,  # (E, hidden, I)
    limit: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """grouped_swiglu's sum with every held expert on every token, each output weighted by
    the token's routing weight for that expert (0 where not routed, or routed elsewhere)."""
    num_held = len(expert_ids)
    local = indices - expert_ids.start
    held = (local >= 0) & (local < num_held)
    routing = torch.zeros(x.shape[0], num_held, dtype=dtype, device=x.device)
    routing.scatter_add_(1, local.clamp(0, num_held - 1), (weights * held).to(dtype))
    h = torch.matmul(x.to(dtype), gate_up.to(dtype).transpose(1, 2))  # (E, T, 2I)
    y = torch.bmm(clamped_swiglu(h, limit), down.to(dtype).transpose(1, 2))  # (E, T, hidden)
    return torch.einsum("te,eth->th", routing, y)


def swiglu_per_expert(
    x: torch.Tensor,  # (T, hidden)
    groups: ExpertGroups,
    gate_up: Callable[[int, torch.Tensor], torch.Tensor],  # (expert, (n, hidden)) → (n, 2I)
    down: Callable[[int, torch.Tensor], torch.Tensor],  # (expert, (n, I)) → (n, hidden)
    limit: float,
) -> torch.Tensor:
    """(T, hidden) fp32: grouped_swiglu's sum, one expert hit at a time through the caller's
    matmuls (`expert` a local id)."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    starts = F.pad(groups.counts.cumsum(0), (1, 0)).tolist()
    rows = x[groups.tokens].float()  # sorted by expert
    y = _expert_by_expert(rows, starts, groups.experts.tolist(), gate_up, down, limit)
    return out.index_add_(0, groups.tokens, y * groups.weights[:, None].float())


def clamped_swiglu(h: torch.Tensor, limit: float) -> torch.Tensor:
    """(..., 2I) gate then up → (..., I): SwiGLU with V4's clamp (gate ≤ limit, |up| ≤ limit)."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)
