"""Torch references of DeepSeek-V4's indexer and compressor kernels (v4_indexer.py,
v4_compress.py), plain torch (importing this module does not import triton). The compressor's
is also the torch path's (models/deepseek_v4/attention.py calls it when a step runs without
kernels); the indexer's scores run there a tile of queries at a time
(deepseek_v4.tiled_attention), tested equal to this per-query definition.

Pool rows and slots padded with the sentinel -1 are masked, never read as data.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def indexer_scores_reference(
    q: torch.Tensor,  # (Q, H, D): the indexer's roped queries
    weights: torch.Tensor,  # (Q, H): each head's weight per query
    keys: torch.Tensor,  # (pool rows, D): the layer's indexer keys
    visible: torch.Tensor,  # (Q, E): pool rows each query may see, -1 padded
    scale: float,
) -> torch.Tensor:
    """(Q, E) fp32: ∑_h weights[t, h] · scale · ReLU(q[t, h] · keys[row]) for each query t and
    each of its visible rows; -inf where the row is -1."""
    gathered = keys[visible.clamp(min=0)].float()  # (Q, E, D)
    scores = F.relu(torch.matmul(q.float(), gathered.transpose(1, 2)))  # (Q, H, E)
    scores = (scores * scale * weights.float()[..., None]).sum(dim=1)  # (Q, E)
    return scores.masked_fill(visible < 0, float("-inf"))


def compress_pool_reference(
    projections: torch.Tensor,  # (num_slots, columns): each token's raw compressor inputs
    column: int,  # this compressor's first column: its kv, then its gate, `width` each
    slots: torch.Tensor,  # (N, rate): the slots of each closing window's tokens
    prev_slots: torch.Tensor | None,  # (N, rate): the window before's, -1 where none; overlap
    position_bias: torch.Tensor,  # (rate, width): added to the gate of each position in a window
    norm_weight: torch.Tensor,  # (head_dim,): the entry's RMS norm weight
    eps: float,
    cos: torch.Tensor,  # (N, rope_dim): the rope at each window's position, pairs repeated
    sin: torch.Tensor,
) -> torch.Tensor:
    """(N, head_dim) fp32: each window's softmax(gate + bias)-weighted sum of its tokens' kv,
    per channel over the window's positions, RMS-normed, then roped on its trailing rope_dim
    channels (interleaved pairs). With prev_slots (CSA: width = 2 · head_dim), a window pools
    the previous window's first series of head_dim channels beside its own second series; a
    missing previous window (-1) takes no weight."""
    width, hd = position_bias.shape[1], norm_weight.shape[0]
    series = projections[:, column : column + 2 * width]  # (num_slots, 2 · width)
    kv, gate = _rows(series, slots).float().chunk(2, dim=-1)  # (N, rate, width) each
    gate = gate + position_bias
    if prev_slots is not None:
        prev_kv, prev_gate = _rows(series, prev_slots.clamp(min=0)).float().chunk(2, dim=-1)
        missing = (prev_slots[:, 0] < 0)[:, None, None]
        prev_kv = prev_kv[..., :hd].masked_fill(missing, 0.0)
        prev_gate = (prev_gate + position_bias)[..., :hd].masked_fill(missing, float("-inf"))
        kv = torch.cat([prev_kv, kv[..., hd:]], dim=1)  # (N, 2 · rate, hd)
        gate = torch.cat([prev_gate, gate[..., hd:]], dim=1)
    pooled = (kv * gate.softmax(dim=1)).sum(dim=1)  # (N, hd)
    normed = norm_weight * (pooled * torch.rsqrt(pooled.pow(2).mean(-1, keepdim=True) + eps))
    return _rope(normed.float(), cos, sin)


def _rows(values: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """values[slots] for (N, rate) slots, through index_select on the flattened slots (several
    times faster on CPU than indexing with a 2-d tensor)."""
    return values.index_select(0, slots.flatten()).view(*slots.shape, values.shape[1])


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """models/deepseek_v4/layers.apply_rope on (N, head_dim) rows (kept here: the model
    package imports this module, not the reverse)."""
    rope_dim = cos.shape[-1]
    nope, rope = x[..., :-rope_dim], x[..., -rope_dim:]
    pairs = torch.stack((-rope[..., 1::2], rope[..., 0::2]), dim=-1).flatten(-2)
    return torch.cat([nope, rope * cos + pairs * sin], dim=-1)
