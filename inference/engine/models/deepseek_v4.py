"""DeepSeek-V4 (Flash), built bottom-up over the engine's paged state.

The architecture is transformers' `DeepseekV4ForCausalLM` (5.24), the reference every test
compares against; parameter names are transformers', so a checkpoint saved by it (or our tiny
random one, written the same way) loads with `load_state_dict`. Per layer:

- attention with a sliding-window K=V branch (shared-KV MQA: one KV head of head_dim, K = V,
  partial interleaved RoPE on the last rope_dim channels, undone on the output), learned
  per-head sinks and a grouped low-rank output projection; CSA layers add compressed entries
  (one per 4 tokens over overlapping windows) picked per query by a lightning indexer's top-k,
  HCA layers one entry per 128 tokens, all visible;
- a MoE MLP (top-k routed, or hash-routed by token id in the first layers) plus a shared expert;
- manifold-constrained hyper-connections (hc_mult residual streams, Sinkhorn-mixed).

The per-request state lives in deepseek_v4_state (which group holds what, and why that
resumes exactly at any position). Attention runs per sequence in torch (no kernel yet).
The checkpoint's multi-token-prediction layer (`mtp.*`) is not used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.models.deepseek_v4_config import CSA, HCA, SLIDING, DeepseekV4Config
from inference.engine.models.deepseek_v4_state import (
    DeepseekV4Metadata,
    DeepseekV4MetadataBuilder,
    DeepseekV4State,
    LayerState,
    SequenceState,
)
from inference.engine.models.deepseek_v4_weights import to_model_names


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h).to(x.dtype)


def unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)


# ---- rotary: interleaved pairs on the trailing rope_dim channels ------------------------------


def rope_inv_freq(config: DeepseekV4Config, theta: float, yarn: dict | None) -> torch.Tensor:
    """One frequency per channel pair; YaRN blends interpolated and extrapolated ones."""
    dim = config.rope_dim
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    if yarn is None:
        return 1.0 / pos_freqs
    factor = float(yarn["factor"])
    original = int(yarn["original_max_position_embeddings"])
    beta_fast, beta_slow = yarn.get("beta_fast") or 32, yarn.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


class Rotary(nn.Module):
    def __init__(self, inv_freq: torch.Tensor, scaling: float = 1.0) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.scaling = scaling

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin: (T, 1, rope_dim), each pair's angle repeated for both its channels."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]  # (T, rope_dim / 2)
        cos = (freqs.cos() * self.scaling).repeat_interleave(2, dim=-1)
        sin = (freqs.sin() * self.scaling).repeat_interleave(2, dim=-1)
        return cos[:, None, :], sin[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (T, heads, head_dim); rotates its last rope_dim channels pairwise, in fp32."""
    rope_dim = cos.shape[-1]
    nope, rope = x[..., :-rope_dim], x[..., -rope_dim:]
    pairs = torch.stack((-rope[..., 1::2], rope[..., 0::2]), dim=-1).flatten(-2)
    rotated = (rope.float() * cos + pairs.float() * sin).to(x.dtype)
    return torch.cat([nope, rotated], dim=-1)


@dataclass(frozen=True, slots=True)
class Ropes:
    """A step's cos/sin at its positions for both rope kinds (sliding layers use "main",
    compressor layers "compress"), and the compress rotary for entries' own positions."""

    main: tuple[torch.Tensor, torch.Tensor]
    compress: tuple[torch.Tensor, torch.Tensor]
    compress_rotary: Rotary


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
            lo = self.rate * (first - 1 if compressor.overlap and first > 0 else first)
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
        lo = max(0, seq.start - self.window + 1)
        keys = state.window[meta.window_slots_of(seq, lo, seq.end)].to(q.dtype)  # (K, D)
        key_pos = torch.arange(lo, seq.end, device=q.device)
        visible = (key_pos[None, :] <= positions[:, None]) & (
            key_pos[None, :] > positions[:, None] - self.window
        )
        bias = torch.zeros(visible.shape, dtype=torch.float, device=q.device).masked_fill(
            ~visible, float("-inf")
        )
        num_entries = seq.end // self.rate if self.rate else 0
        if num_entries:
            if self.kind == HCA:
                entries = state.entries[meta.hca_entry_ids(seq, 0, num_entries, self.rate)]
                closed = (positions + 1) // self.rate
                entry_bias = torch.zeros(len(positions), num_entries, device=q.device)
                entry_bias.masked_fill_(
                    torch.arange(num_entries, device=q.device)[None, :] >= closed[:, None],
                    float("-inf"),
                )
            else:
                ids = meta.csa_entry_ids(seq, 0, num_entries)
                entries = state.entries[ids]
                rows = slice(seq.query_start, seq.query_start + seq.query_len)
                cos, sin = ropes.compress
                entry_bias = self.compressor.indexer.select(
                    x,
                    q_residual,
                    (cos[rows], sin[rows]),
                    state.index_entries[ids],
                    positions,
                    self.rate,
                )
            keys = torch.cat([keys, entries.to(q.dtype)])
            bias = torch.cat([bias, entry_bias], dim=1)
        logits = (
            torch.einsum("qhd,kd->qhk", q.float(), keys.float()) * self.scale + bias[:, None, :]
        )
        sinks = self.sinks.float()[None, :, None].expand(q.shape[0], -1, 1)
        combined = torch.cat([logits, sinks], dim=-1)
        probs = (combined - combined.amax(dim=-1, keepdim=True)).softmax(dim=-1)[..., :-1]
        return torch.einsum("qhk,kd->qhd", probs, keys.float()).to(q.dtype)


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
    def __init__(self, config: DeepseekV4Config) -> None:
        super().__init__()
        e, d, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.zeros(e, 2 * i, d))
        self.down_proj = nn.Parameter(torch.zeros(e, d, i))
        self.limit = config.swiglu_limit

    def forward(
        self, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        out = torch.zeros_like(x)
        for expert in indices.unique().tolist():
            tokens, slot = torch.where(indices == expert)
            gate, up = F.linear(x[tokens], self.gate_up_proj[expert]).chunk(2, dim=-1)
            h = F.silu(gate.clamp(max=self.limit)) * up.clamp(min=-self.limit, max=self.limit)
            h = F.linear(h, self.down_proj[expert]) * weights[tokens, slot, None]
            out.index_add_(0, tokens, h.to(out.dtype))
        return out


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


# ---- hyper-connections ------------------------------------------------------------------------


class HyperConnection(nn.Module):
    """mHC: from the hc_mult streams, weights to collapse them into a block's input (pre), to
    spread its output back (post), and a doubly-stochastic mix of the streams (comb)."""

    def __init__(self, config: DeepseekV4Config) -> None:
        super().__init__()
        n = config.hc_mult
        self.hc_mult, self.iters, self.eps = n, config.hc_sinkhorn_iters, config.hc_eps
        self.norm_eps = config.rms_norm_eps
        self.fn = nn.Parameter(torch.zeros((2 + n) * n, n * config.hidden_size))
        self.base = nn.Parameter(torch.zeros((2 + n) * n))
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = self.hc_mult
        flat = unweighted_rms_norm(streams.flatten(1).float(), self.norm_eps)  # (T, n·hidden)
        pre, post, comb = F.linear(flat, self.fn.float()).split([n, n, n * n], dim=-1)
        pre_b, post_b, comb_b = self.base.split([n, n, n * n])
        pre_s, post_s, comb_s = self.scale.unbind(0)
        pre = torch.sigmoid(pre * pre_s + pre_b) + self.eps  # (T, n)
        post = 2 * torch.sigmoid(post * post_s + post_b)  # (T, n)
        comb = torch.softmax(comb.view(-1, n, n) * comb_s + comb_b.view(n, n), dim=-1) + self.eps
        comb = comb / (comb.sum(dim=-2, keepdim=True) + self.eps)
        for _ in range(self.iters - 1):  # Sinkhorn-Knopp: rows, then columns, sum to 1
            comb = comb / (comb.sum(dim=-1, keepdim=True) + self.eps)
            comb = comb / (comb.sum(dim=-2, keepdim=True) + self.eps)
        collapsed = (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)  # (T, hidden)
        return post, comb, collapsed


class HyperHead(nn.Module):
    def __init__(self, config: DeepseekV4Config) -> None:
        super().__init__()
        n = config.hc_mult
        self.eps, self.norm_eps = config.hc_eps, config.rms_norm_eps
        self.hc_fn = nn.Parameter(torch.zeros(n, n * config.hidden_size))
        self.hc_base = nn.Parameter(torch.zeros(n))
        self.hc_scale = nn.Parameter(torch.ones(1))

    def forward(self, streams: torch.Tensor) -> torch.Tensor:
        flat = unweighted_rms_norm(streams.flatten(1).float(), self.norm_eps)
        mixes = F.linear(flat, self.hc_fn.float())
        pre = torch.sigmoid(mixes * self.hc_scale.float() + self.hc_base.float()) + self.eps
        return (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)


def mix(
    post: torch.Tensor, comb: torch.Tensor, out: torch.Tensor, streams: torch.Tensor
) -> torch.Tensor:
    """The block's output spread over the streams, plus the streams mixed (comb read as
    sum_j comb[j, k] · stream_j)."""
    dtype = streams.dtype
    return post.to(dtype).unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(
        comb.to(dtype).transpose(-1, -2), streams
    )


class DecoderLayer(nn.Module):
    def __init__(self, config: DeepseekV4Config, index: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, config.attention_kinds[index])
        self.mlp = MoE(config, config.mlp_kinds[index] == "hash_moe")
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn_hc = HyperConnection(config)
        self.ffn_hc = HyperConnection(config)

    def forward(self, streams, input_ids, positions, ropes, state, meta) -> torch.Tensor:
        post, comb, collapsed = self.attn_hc(streams)  # streams: (T, hc_mult, hidden)
        out = self.self_attn(self.input_layernorm(collapsed), positions, ropes, state, meta)
        streams = mix(post, comb, out, streams)
        post, comb, collapsed = self.ffn_hc(streams)
        out = self.mlp(self.post_attention_layernorm(collapsed), input_ids)
        return mix(post, comb, out, streams)


class DeepseekV4Model(nn.Module):
    def __init__(self, config: DeepseekV4Config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hc_head = HyperHead(config)


class DeepseekV4ForCausalLM(nn.Module):
    def __init__(self, config: DeepseekV4Config) -> None:
        super().__init__()
        self.config = config
        self.model = DeepseekV4Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        compress = config.compress_rope
        yarn = compress if compress.get("rope_type") == "yarn" else None
        self.rotary = nn.ModuleDict(
            {
                "main": Rotary(rope_inv_freq(config, config.rope_theta, None)),
                "compress": Rotary(
                    rope_inv_freq(config, float(compress.get("rope_theta", 160000.0)), yarn),
                    float(compress.get("attention_factor", 1.0)) if yarn else 1.0,
                ),
            }
        )

    # ---- the engine's seam: its own state layout and metadata --------------------------------

    def allocate_state(
        self,
        num_blocks: int,
        num_window_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> DeepseekV4State:
        return DeepseekV4State(
            self.config, num_blocks, num_window_blocks, block_size, dtype, device
        )

    def metadata_builder(self, block_size: int, device: torch.device) -> DeepseekV4MetadataBuilder:
        return DeepseekV4MetadataBuilder(self.config, block_size, device)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        states: list[LayerState],  # per layer
        meta: DeepseekV4Metadata,
        logits_indices: torch.Tensor,  # (N,) rows whose next-token logits are wanted
    ) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)  # (T, hidden)
        streams = x.unsqueeze(1).expand(-1, self.config.hc_mult, -1).contiguous()  # (T, n, hidden)
        compress = self.rotary["compress"]
        ropes = Ropes(self.rotary["main"](positions), compress(positions), compress)
        for layer, state in zip(self.model.layers, states, strict=True):
            streams = layer(streams, input_ids, positions, ropes, state, meta)
        h = self.model.norm(self.model.hc_head(streams[logits_indices]))
        return self.lm_head(h)  # (N, vocab)

    @torch.inference_mode()
    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """DeepSeek's names and FP8/FP4 weights (deepseek_v4_weights) or transformers' names;
        the MTP layer's tensors (`mtp.*`) are left out."""
        weights = to_model_names(weights)
        weights = {
            k: v for k, v in weights.items() if not k.startswith("mtp.") and ".mtp." not in k
        }
        if self.config.tie_word_embeddings and "lm_head.weight" not in weights:
            weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
        result = self.load_state_dict(weights, strict=False)
        if result.missing_keys or result.unexpected_keys:
            raise ValueError(
                "this DeepSeek-V4 checkpoint does not match its config.json: "
                f"missing {result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]}"
            )
