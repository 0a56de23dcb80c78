"""DeepSeek-V4's attention: the sliding-window K=V branch every layer has, with sinks and the
grouped output projection; CSA's overlapping compressor and lightning indexer; HCA's compressor.
It reads and writes the request state laid out in deepseek_v4.state, one sequence at a time
(torch; no kernel yet)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.models.deepseek_v4.config import CSA, HCA, SLIDING, DeepseekV4Config
from inference.engine.models.deepseek_v4.layers import (
    RMSNorm,
    Rotary,
    apply_rope,
    unweighted_rms_norm,
)
from inference.engine.models.deepseek_v4.state import (
    DeepseekV4Metadata,
    LayerState,
    SequenceState,
)

# ---- compressors ------------------------------------------------------------------------------


class Compressor(nn.Module):
    """Pools each closed window of `rate` tokens into one entry: the softmax(gate + bias)
    weighted sum of the tokens' kv, RMS-normed, roped at the window's first position. With
    `overlap`, entry w pools window w-1's first series with window w's second (CSA's windows
    of width 2·rate, stride rate); the raw per-token (kv, gate) live in the window state."""

    def __init__(self, hidden: int, head_dim: int, rate: int, overlap: bool, eps: float) -> None:
        super().__init__()
        self.rate, self.head_dim, self.overlap = rate, head_dim, overlap
        width = 2 * head_dim if overlap else head_dim
        self.kv_proj = nn.Linear(hidden, width, bias=False)
        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.position_bias = nn.Parameter(torch.zeros(rate, width))
        self.kv_norm = RMSNorm(head_dim, eps)

    @property
    def projection_width(self) -> int:
        return 2 * self.kv_proj.out_features

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """(T, projection_width): each token's raw kv and gate, kept in the window state."""
        return torch.cat([self.kv_proj(x), self.gate_proj(x)], dim=-1)

    def pool(self, raw: torch.Tensor, first: int, count: int, rotary: Rotary) -> torch.Tensor:
        """Entries [first, first + count) from `raw` (the tokens of windows [first - 1 or
        first, first + count), as project() made them): (count, head_dim)."""
        rate, hd = self.rate, self.head_dim
        kv, gate = raw.float().chunk(2, dim=-1)
        num_windows = kv.shape[0] // rate
        kv = kv.view(num_windows, rate, -1)  # (windows, rate, width)
        gate = gate.view(num_windows, rate, -1) + self.position_bias
        if self.overlap:
            has_prev = num_windows - count  # 1 when window first - 1 was passed in
            pad_kv = kv.new_zeros(1, rate, hd)
            pad_gate = gate.new_full((1, rate, hd), float("-inf"))
            prev_kv = torch.cat([pad_kv, kv[..., :hd]])[has_prev : has_prev + count]
            prev_gate = torch.cat([pad_gate, gate[..., :hd]])[has_prev : has_prev + count]
            kv = torch.cat([prev_kv, kv[has_prev:, :, hd:]], dim=1)  # (count, 2·rate, hd)
            gate = torch.cat([prev_gate, gate[has_prev:, :, hd:]], dim=1)
        pooled = self.kv_norm((kv * gate.softmax(dim=1)).sum(dim=1))  # (count, hd)
        positions = torch.arange(first, first + count, device=raw.device) * rate
        cos, sin = rotary(positions)
        return apply_rope(pooled[:, None, :], cos, sin)[:, 0, :]


class Indexer(Compressor):
    """The lightning indexer: its own overlapping compressor at index_head_dim, and a score
    ∑_h w_{t,h} · ReLU(q_{t,h} · K_s) per query and entry; a query keeps the top-k entries."""

    def __init__(self, config: DeepseekV4Config) -> None:
        super().__init__(
            config.hidden_size, config.index_head_dim, config.csa_rate, True, config.rms_norm_eps
        )
        self.num_heads, self.topk = config.index_n_heads, config.index_topk
        self.q_b_proj = nn.Linear(config.q_lora_rank, self.num_heads * self.head_dim, bias=False)
        self.scorer = nn.Module()
        self.scorer.weights_proj = nn.Linear(config.hidden_size, self.num_heads, bias=False)

    def select(
        self,
        x: torch.Tensor,  # (Q, hidden)
        q_residual: torch.Tensor,  # (Q, q_lora_rank)
        rope: tuple[torch.Tensor, torch.Tensor],
        keys: torch.Tensor,  # (E, index_head_dim)
        positions: torch.Tensor,  # (Q,)
        rate: int,
    ) -> torch.Tensor:
        """(Q, E) additive mask: 0 where the query keeps the entry, -inf elsewhere."""
        num_entries = keys.shape[0]
        q = self.q_b_proj(q_residual).view(-1, self.num_heads, self.head_dim)  # (Q, H, D)
        q = apply_rope(q, *rope)
        scores = F.relu(torch.einsum("qhd,ed->qhe", q.float(), keys.float())) * self.head_dim**-0.5
        weights = self.scorer.weights_proj(x).float() * self.num_heads**-0.5  # (Q, H)
        scores = (scores * weights[..., None]).sum(dim=1)  # (Q, E)
        closed = (positions + 1) // rate  # entries a query may see: windows ended by it
        future = torch.arange(num_entries, device=x.device)[None, :] >= closed[:, None]
        picks = (
            scores.masked_fill(future, float("-inf"))
            .topk(min(self.topk, num_entries), dim=-1)
            .indices
        )
        picks = torch.where(picks < closed[:, None], picks, num_entries)  # unusable → spare column
        mask = scores.new_full((q.shape[0], num_entries + 1), float("-inf"))
        return mask.scatter_(-1, picks, 0.0)[:, :num_entries]


# ---- attention --------------------------------------------------------------------------------


class GroupedLinear(nn.Linear):
    """Block-diagonal projection: each of n_groups head groups to its own o_lora_rank slice."""

    def __init__(self, in_per_group: int, out_features: int, n_groups: int) -> None:
        super().__init__(in_per_group, out_features, bias=False)
        self.n_groups = n_groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, groups, in) → (T, groups · out)
        w = self.weight.view(self.n_groups, -1, x.shape[-1]).transpose(1, 2)  # (G, in, out/G)
        return torch.bmm(x.transpose(0, 1), w).transpose(0, 1).flatten(1)


class Attention(nn.Module):
    def __init__(self, config: DeepseekV4Config, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.window, self.eps = config.sliding_window, config.rms_norm_eps
        self.scale = config.head_dim**-0.5
        self.q_a_proj = nn.Linear(config.hidden_size, config.q_lora_rank, bias=False)
        self.q_a_norm = RMSNorm(config.q_lora_rank, config.rms_norm_eps)
        self.q_b_proj = nn.Linear(config.q_lora_rank, self.num_heads * self.head_dim, bias=False)
        self.kv_proj = nn.Linear(config.hidden_size, self.head_dim, bias=False)
        self.kv_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        in_per_group = self.num_heads * self.head_dim // config.o_groups
        self.o_a_proj = GroupedLinear(
            in_per_group, config.o_groups * config.o_lora_rank, config.o_groups
        )
        self.o_b_proj = nn.Linear(
            config.o_groups * config.o_lora_rank, config.hidden_size, bias=False
        )
        self.sinks = nn.Parameter(torch.zeros(self.num_heads))
        self.compressor: Compressor | None = None
        self.rate = config.rate_of(kind) if kind != SLIDING else 0
        if kind != SLIDING:
            self.compressor = Compressor(
                config.hidden_size, self.head_dim, self.rate, kind == CSA, config.rms_norm_eps
            )
            if kind == CSA:
                self.compressor.indexer = Indexer(config)

    def forward(
        self, x, positions, ropes, state: LayerState, meta: DeepseekV4Metadata
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        cos, sin = ropes.main if self.kind == SLIDING else ropes.compress
        q_residual = self.q_a_norm(self.q_a_proj(x))  # (T, q_lora_rank)
        q = self.q_b_proj(q_residual).view(num_tokens, self.num_heads, self.head_dim)
        q = apply_rope(unweighted_rms_norm(q, self.eps), cos, sin)  # (T, H, D)
        kv = apply_rope(self.kv_norm(self.kv_proj(x))[:, None, :], cos, sin)[:, 0]  # (T, D)
        state.window[meta.window_slots] = kv.to(state.window.dtype)
        if self.compressor is not None:
            self._compress(x, state, meta, ropes.compress_rotary)
        out = torch.empty_like(q)
        for seq in meta.sequences:
            rows = slice(seq.query_start, seq.query_start + seq.query_len)
            out[rows] = self._attend(
                seq, q[rows], x[rows], q_residual[rows], positions[rows], ropes, state, meta
            )
        out = apply_rope(out, cos, -sin)  # K = V carried RoPE into the output: undo it
        grouped = out.reshape(num_tokens, self.o_a_proj.n_groups, -1)  # (T, G, H·D / G)
        return self.o_b_proj(self.o_a_proj(grouped))

    def _compress(self, x, state: LayerState, meta: DeepseekV4Metadata, rotary: Rotary) -> None:
        """Store the new tokens' compressor inputs, then pool every window they close."""
        compressor, indexer = self.compressor, getattr(self.compressor, "indexer", None)
        projections = compressor.project(x)
        if indexer is not None:
            projections = torch.cat([projections, indexer.project(x)], dim=-1)
        state.projections[meta.window_slots] = projections.to(state.projections.dtype)
        split = compressor.projection_width
        for seq in meta.sequences:
            first, last = seq.start // self.rate, seq.end // self.rate  # windows closed now
            if first == last:
                continue
            # CSA pools window first - 1's first series too, where it exists (a bounded
            # replay has no window state before its start: its first window pools alone).
            has_prev = compressor.overlap and first > 0
            has_prev = has_prev and self.rate * (first - 1) >= seq.window_start
            lo = self.rate * (first - 1 if has_prev else first)
            raw = state.projections[meta.window_slots_of(seq, lo, self.rate * last)]
            entries = compressor.pool(raw[:, :split], first, last - first, rotary)
            if self.kind == HCA:
                state.entries[meta.hca_entry_ids(seq, first, last, self.rate)] = entries.to(
                    state.entries.dtype
                )
                continue
            ids = meta.csa_entry_ids(seq, first, last)
            state.entries[ids] = entries.to(state.entries.dtype)
            keys = indexer.pool(raw[:, split:], first, last - first, rotary)
            state.index_entries[ids] = keys.to(state.index_entries.dtype)

    def _attend(self, seq: SequenceState, q, x, q_residual, positions, ropes, state, meta):
        """(Q, H, D): the sequence's queries over their window and their compressed entries."""
        lo = max(seq.window_start, seq.start - self.window + 1)
        keys = state.window[meta.window_slots_of(seq, lo, seq.end)].to(q.dtype)  # (K, D)
        key_pos = torch.arange(lo, seq.end, device=q.device)
        visible = (key_pos[None, :] <= positions[:, None]) & (
            key_pos[None, :] > positions[:, None] - self.window
        )
        bias = torch.zeros(visible.shape, dtype=torch.float, device=q.device).masked_fill(
            ~visible, float("-inf")
        )
        if self.rate and seq.end >= self.rate:  # some compressor window has closed
            entries, entry_bias = self._entries(seq, x, q_residual, positions, ropes, state, meta)
            keys = torch.cat([keys, entries.to(q.dtype)])
            bias = torch.cat([bias, entry_bias], dim=1)
        logits = (
            torch.einsum("qhd,kd->qhk", q.float(), keys.float()) * self.scale + bias[:, None, :]
        )
        sinks = self.sinks.float()[None, :, None].expand(q.shape[0], -1, 1)
        combined = torch.cat([logits, sinks], dim=-1)
        probs = (combined - combined.amax(dim=-1, keepdim=True)).softmax(dim=-1)[..., :-1]
        return torch.einsum("qhk,kd->qhd", probs, keys.float()).to(q.dtype)

    def _entries(self, seq: SequenceState, x, q_residual, positions, ropes, state, meta):
        """The sequence's compressed entries, (E, D), and which each query sees, (Q, E): HCA's
        all that its windows closed by the query's position, CSA's the indexer's top-k of those."""
        num_entries = seq.end // self.rate
        closed = (positions + 1) // self.rate  # entries a query may see: windows ended by it
        if self.kind == HCA:
            entries = state.entries[meta.hca_entry_ids(seq, 0, num_entries, self.rate)]
            future = torch.arange(num_entries, device=x.device)[None, :] >= closed[:, None]
            bias = torch.zeros(future.shape, device=x.device).masked_fill(future, float("-inf"))
            return entries, bias
        ids = meta.csa_entry_ids(seq, 0, num_entries)
        rows = slice(seq.query_start, seq.query_start + seq.query_len)
        cos, sin = ropes.compress
        bias = self.compressor.indexer.select(
            x, q_residual, (cos[rows], sin[rows]), state.index_entries[ids], positions, self.rate
        )
        return state.entries[ids], bias
