"""DeepSeek-V4 (Flash): the decoder layers and the causal LM the engine runs.

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

The per-request state lives in deepseek_v4.state (which group holds what, and why that
resumes exactly at any position). Attention runs per sequence in torch (no kernel yet).
The checkpoint's multi-token-prediction layer (`mtp.*`) is not used.
"""

from __future__ import annotations

import torch
from torch import nn

from inference.engine.models.deepseek_v4.attention import Attention
from inference.engine.models.deepseek_v4.config import DeepseekV4Config
from inference.engine.models.deepseek_v4.hyper_connections import HyperConnection, HyperHead, mix
from inference.engine.models.deepseek_v4.layers import RMSNorm, Ropes, Rotary, rope_inv_freq
from inference.engine.models.deepseek_v4.moe import MoE
from inference.engine.models.deepseek_v4.state import (
    DeepseekV4Metadata,
    DeepseekV4MetadataBuilder,
    DeepseekV4State,
    LayerState,
)
from inference.engine.models.deepseek_v4.weights import to_model_names


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
        """DeepSeek's names and FP8/FP4 weights (deepseek_v4.weights) or transformers' names;
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
