"""DeepSeek-V4 (Flash): the decoder layers and the causal LM the engine runs.

The architecture is transformers' `DeepseekV4ForCausalLM` (5.24), the reference every test
compares against; parameter names are transformers'. Checkpoints (any V4 layout, FP8/FP4 kept
packed) load through deepseek_v4.loader. Per layer:

- attention with a sliding-window K=V branch (shared-KV MQA: one KV head of head_dim, K = V,
  partial interleaved RoPE on the last rope_dim channels, undone on the output), learned
  per-head sinks and a grouped low-rank output projection; CSA layers add compressed entries
  (one per 4 tokens over overlapping windows) picked per query by a lightning indexer's top-k,
  HCA layers one entry per 128 tokens, all visible;
- a MoE MLP (top-k routed, or hash-routed by token id in the first layers) plus a shared expert;
- manifold-constrained hyper-connections (hc_mult residual streams, Sinkhorn-mixed).

The per-request state lives in deepseek_v4.state (which group holds what, and why that
resumes exactly at any position); the engine allocates and plans it through its config's
`paged_state_spec()` (deepseek_v4.state_spec). Attention runs in torch over all of a step's
sequences at once (deepseek_v4.step_tables; no kernel yet), the routed experts as one grouped
computation.
The checkpoint's multi-token-prediction layer (`mtp.0.*`), when its config declares one, is
built and loaded (deepseek_v4.mtp) and drafts a token per step for speculative decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from inference.engine.models.deepseek_v4.attention import Attention
from inference.engine.models.deepseek_v4.config import SLIDING, DeepseekV4Config
from inference.engine.models.deepseek_v4.hyper_connections import HyperConnection, HyperHead, mix
from inference.engine.models.deepseek_v4.layers import RMSNorm, Ropes, Rotary, rope_inv_freq
from inference.engine.models.deepseek_v4.moe import MoE
from inference.engine.models.deepseek_v4.mtp import MTPLayer
from inference.engine.models.deepseek_v4.state import DeepseekV4Metadata, LayerState
from inference.engine.models.logits_head import LogitsHead


@dataclass(slots=True)
class DraftContext:
    """What the MTP layer reads from the step's main forward."""

    streams: torch.Tensor  # (T, hc_mult, hidden): after the last layer, before the head
    positions: torch.Tensor
    ropes: Ropes
    meta: DeepseekV4Metadata


class DecoderLayer(nn.Module):
    def __init__(
        self,
        config: DeepseekV4Config,
        index: int,
        *,
        attention_kind: str | None = None,  # the MTP layer's (past the config's lists)
    ) -> None:
        super().__init__()
        self.self_attn = Attention(config, attention_kind or config.attention_kinds[index])
        # The MTP layer's (index num_layers) is top-k routed: hash routing is the first layers'.
        is_hash = index < config.num_layers and config.mlp_kinds[index] == "hash_moe"
        self.mlp = MoE(config, is_hash)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn_hc = HyperConnection(config)
        self.ffn_hc = HyperConnection(config)

    def forward(self, streams, input_ids, positions, ropes, state, meta, rows=None) -> torch.Tensor:
        """(T, hc_mult, hidden): the streams after the layer; with `rows` (R,), only theirs
        (the layer's state is written for every token either way)."""
        post, comb, collapsed = self.attn_hc(streams)  # streams: (T, hc_mult, hidden)
        out = self.self_attn(self.input_layernorm(collapsed), positions, ropes, state, meta, rows)
        if rows is not None:  # only these rows go on: the mix and the MoE for them alone
            post, comb, streams, input_ids = post[rows], comb[rows], streams[rows], input_ids[rows]
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


def rotary_embeddings(config: DeepseekV4Config) -> nn.ModuleDict:
    """The main and compress rotary tables (computed, never loaded)."""
    compress = config.compress_rope
    yarn = compress if compress.get("rope_type") == "yarn" else None
    return nn.ModuleDict(
        {
            "main": Rotary(rope_inv_freq(config, config.rope_theta, None)),
            "compress": Rotary(
                rope_inv_freq(config, float(compress.get("rope_theta", 160000.0)), yarn),
                float(compress.get("attention_factor", 1.0)) if yarn else 1.0,
            ),
        }
    )


class DeepseekV4ForCausalLM(nn.Module):
    def __init__(self, config: DeepseekV4Config) -> None:
        super().__init__()
        self.config = config
        self.model = DeepseekV4Model(config)
        self.lm_head = LogitsHead(config.hidden_size, config.vocab_size)  # models/logits_head.py
        self.rotary = rotary_embeddings(config)
        # Last, so a checkpoint's random init draws the main weights as before (tiny.py).
        self.mtp = nn.ModuleList(
            MTPLayer(config, DecoderLayer(config, config.num_layers, attention_kind=SLIDING))
            for _ in range(min(config.num_mtp_layers, 1))
        )

    @property
    def has_mtp(self) -> bool:
        return len(self.mtp) > 0

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        states: list[LayerState],  # per layer
        meta: DeepseekV4Metadata,
        logits_indices: torch.Tensor,  # (N,) rows whose next-token logits are wanted
        *,
        keep_for_draft: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, DraftContext]:
        """The logits of `logits_indices`; with `keep_for_draft`, also what the MTP layer's
        draft step reads (draft_logits)."""
        x = self.model.embed_tokens(input_ids)  # (T, hidden)
        streams = x.unsqueeze(1).expand(-1, self.config.hc_mult, -1).contiguous()  # (T, n, hidden)
        compress = self.rotary["compress"]
        ropes = Ropes(self.rotary["main"](positions), compress(positions), compress)
        # The last layer's queries, mix and MoE run for the logits' rows alone: the head reads
        # only those (its state is written for every token). The MTP layer reads every row.
        head_rows = None if keep_for_draft else logits_indices
        last = len(self.model.layers) - 1
        for index, (layer, state) in enumerate(zip(self.model.layers, states, strict=True)):
            rows = head_rows if index == last else None
            streams = layer(streams, input_ids, positions, ropes, state, meta, rows)
        # With head_rows, the last layer gave only those rows.
        at_rows = streams[logits_indices] if head_rows is None else streams
        h = self.model.norm(self.model.hc_head(at_rows))
        logits = self.lm_head(h)  # (N, vocab)
        if keep_for_draft:
            return logits, DraftContext(streams, positions, ropes, meta)
        return logits

    @torch.inference_mode()
    def draft_logits(
        self,
        context: DraftContext,
        next_ids: torch.Tensor,  # (T,) each row's next token
        state: LayerState,  # the MTP layer's (DeepseekV4State.mtp_layer)
        rows: torch.Tensor,  # (N,) rows to draft from
    ) -> torch.Tensor:
        """The MTP layer over the step's rows (its K=V written at every one), and its logits
        at `rows`: the token after each row's next token."""
        mtp = self.mtp[0]
        h = mtp(
            context.streams,
            self.model.embed_tokens(next_ids),
            next_ids,
            context.positions,
            context.ropes,
            state,
            context.meta,
            rows,
        )
        return self.lm_head(h)  # (N, vocab)
