"""The Gemma 3 text architecture (Gemma 3 270M), built bottom-up.

What differs from llama: sliding-window layers (window W) interleaved with global ones, RoPE
with a separate base for each kind, RMSNorm on every head's q and k, four norms per layer
(around attention and around the MLP), norms that scale by (1 + w), embeddings scaled by
sqrt(hidden), GeGLU (tanh GELU), query scale query_pre_attn_scalar**-0.5, tied lm_head.

Weights arrive as a dict in HF naming; gguf_names_to_hf maps a GGUF file's names and takes
back the +1 that llama.cpp's converter folds into every norm weight (as transformers does), so
the same module loads either source. GGUF stores Gemma's Q/K rows unpermuted (NEOX RoPE).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.attention.attention_backend import AttentionMetadata
from inference.engine.models.llama import (
    LlamaMLP,
    PagedKVConfig,
    apply_rope,
    hf_names_from_gguf,
    load_layer_linears,
    take_weight,
)

LAYER_TYPES = ("full", "sliding")
# llama.cpp and transformers both fix the pattern at 5 sliding layers to 1 global for Gemma 3
# when the file does not say otherwise.
_DEFAULT_SLIDING_PATTERN = 6


@dataclass(frozen=True, slots=True)
class Gemma3Config(PagedKVConfig):
    rope_theta: float  # global layers
    rope_local_theta: float  # sliding layers
    rms_norm_eps: float
    max_position_embeddings: int
    layer_types: tuple[str, ...]  # one per layer: "full" | "sliding"
    sliding_window: int | None
    query_pre_attn_scalar: float
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.num_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers"
            )
        if not set(self.layer_types) <= set(LAYER_TYPES):
            raise ValueError(f"layer_types must be among {LAYER_TYPES}, got {self.layer_types}")
        if "sliding" in self.layer_types and not (self.sliding_window or 0) > 0:
            raise ValueError(f"sliding layers need a sliding_window ≥ 1, got {self.sliding_window}")

    @classmethod
    def from_gguf_metadata(cls, md: dict[str, Any], vocab_size: int) -> Gemma3Config:
        arch = md["general.architecture"]
        hidden = int(md[f"{arch}.embedding_length"])
        heads = int(md[f"{arch}.attention.head_count"])
        num_layers = int(md[f"{arch}.block_count"])
        head_dim = int(md.get(f"{arch}.attention.key_length", hidden // heads))
        return cls(
            vocab_size=int(md.get(f"{arch}.vocab_size", vocab_size)),
            hidden_size=hidden,
            intermediate_size=int(md[f"{arch}.feed_forward_length"]),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=int(md.get(f"{arch}.attention.head_count_kv", heads)),
            head_dim=head_dim,
            rope_theta=float(md.get(f"{arch}.rope.freq_base", 1_000_000.0)),
            rope_local_theta=float(md.get(f"{arch}.rope.freq_base_swa", 10_000.0)),
            rms_norm_eps=float(md.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
            max_position_embeddings=int(md.get(f"{arch}.context_length", 32768)),
            layer_types=_layer_types(
                md.get(f"{arch}.attention.sliding_window_pattern"), num_layers
            ),
            sliding_window=int(md[f"{arch}.attention.sliding_window"]),
            # The file does not carry it; Gemma 3 (except 27B) scales by head_dim, as llama.cpp
            # and transformers' default (256 = head_dim here) do.
            query_pre_attn_scalar=float(head_dim),
        )


def _layer_types(pattern: Any, num_layers: int) -> tuple[str, ...]:
    """From the GGUF's sliding_window_pattern: a period (every Nth layer global) or one bool per
    layer (True = sliding); absent means the Gemma 3 default period."""
    if isinstance(pattern, list):
        if len(pattern) != num_layers:
            raise ValueError(f"sliding_window_pattern has {len(pattern)} entries, not {num_layers}")
        return tuple("sliding" if is_sliding else "full" for is_sliding in pattern)
    period = int(pattern or _DEFAULT_SLIDING_PATTERN)
    return tuple("sliding" if (i + 1) % period else "full" for i in range(num_layers))


class Gemma3Rotary(nn.Module):
    """rotate-half RoPE with cos/sin computed per step in fp32, exactly as transformers does (a
    table for 32k positions × 256 dims × two bases would cost 128 MB)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        # On the CPU whatever the default device: see llama.RotaryEmbedding.
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
        self.register_buffer("inv_freq", 1.0 / theta**exponents, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float()[:, None] * self.inv_freq[None, :]  # (T, head_dim/2)
        angles = torch.cat([angles, angles], dim=-1)  # (T, head_dim)
        return angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)  # (T, 1, head_dim) each


class Gemma3Attention(nn.Module):
    def __init__(self, cfg: Gemma3Config, layer_type: str) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.is_sliding = layer_type == "sliding"
        self.window = cfg.sliding_window if self.is_sliding else None
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        # Stored as the multiplier (1 + w), so the forward pass is a plain rms_norm.
        self.q_norm = nn.Parameter(torch.ones(cfg.head_dim))
        self.k_norm = nn.Parameter(torch.ones(cfg.head_dim))
        self.scale = cfg.query_pre_attn_scalar**-0.5

    def forward(self, x, rope, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # (T, H, D)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # (T, KVH, D)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        q = apply_rope(F.rms_norm(q, (self.head_dim,), self.q_norm, self.eps), rope)
        k = apply_rope(F.rms_norm(k, (self.head_dim,), self.k_norm, self.eps), rope)
        # A sliding layer's cache may be its own (window-sized) group with its own metadata.
        if self.is_sliding:
            meta = meta.sliding or meta
        meta.write_kv(k, v, kv_cache[0], kv_cache[1])
        out = meta.attend(q, k, v, kv_cache[0], kv_cache[1], self.scale, window=self.window)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


_LAYER_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: Gemma3Config, layer_type: str) -> None:
        super().__init__()
        self.eps = cfg.rms_norm_eps
        self.layer_type = layer_type
        for name in _LAYER_NORMS:
            setattr(self, name, nn.Parameter(torch.ones(cfg.hidden_size)))
        self.self_attn = Gemma3Attention(cfg, layer_type)
        self.mlp = LlamaMLP(cfg, activation=_gelu_tanh)  # GeGLU

    def forward(self, x, rope, kv_cache, meta) -> torch.Tensor:
        shape = x.shape[-1:]
        h = self.self_attn(
            F.rms_norm(x, shape, self.input_layernorm, self.eps), rope, kv_cache, meta
        )
        x = x + F.rms_norm(h, shape, self.post_attention_layernorm, self.eps)
        h = self.mlp(F.rms_norm(x, shape, self.pre_feedforward_layernorm, self.eps))
        return x + F.rms_norm(h, shape, self.post_feedforward_layernorm, self.eps)


class TiedLMHead(nn.Module):
    """The lm head that is the embedding (its weight read at call time, never copied)."""

    tied = True

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self._embedding = (embedding,)  # a tuple: not registered twice as a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self._embedding[0].weight)  # (N, vocab)


class Gemma3ForCausalLM(nn.Module):
    has_mtp = False  # no multi-token-prediction layer to draft with

    def __init__(self, cfg: Gemma3Config) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(cfg, t) for t in cfg.layer_types)
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.lm_head = TiedLMHead(self.embed_tokens)
        self.ropes = nn.ModuleDict(
            {
                "full": Gemma3Rotary(cfg.head_dim, cfg.rope_theta),
                "sliding": Gemma3Rotary(cfg.head_dim, cfg.rope_local_theta),
            }
        )
        # The head is the embedding (tied); quantized weights give it a module of its own.
        # As transformers: sqrt(hidden) rounded to the weights' dtype before it multiplies.
        self.register_buffer("embed_scale", torch.tensor(cfg.hidden_size**0.5), persistent=False)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer; sizes may differ
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,  # (N,) rows whose next-token logits are wanted
    ) -> torch.Tensor:
        weight = self.embed_tokens.weight
        x = self.embed_tokens(input_ids) * self.embed_scale.to(weight.dtype)  # (T, hidden)
        rope = {kind: rotary(positions) for kind, rotary in self.ropes.items()}
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, rope[layer.layer_type], kv_cache, meta)
        x = F.rms_norm(x[logits_indices], x.shape[-1:], self.norm, self.config.rms_norm_eps)
        return self.lm_head(x)  # (N, vocab)

    @torch.inference_mode()
    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load HF-named weights (norms as w, applied as 1 + w), fusing q/k/v and gate/up."""

        def norm(name: str) -> torch.Tensor:
            # The same fp32 sum transformers computes.
            return 1.0 + take_weight(weights, name).float()

        embed = take_weight(weights, "model.embed_tokens.weight")
        head = weights.get("lm_head.weight")
        if head is not None and not torch.equal(head, embed):
            raise ValueError(
                "this Gemma 3 checkpoint has an untied lm_head; only tied is supported"
            )
        self.embed_tokens.weight.copy_(embed)
        self.norm.copy_(norm("model.norm.weight"))
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            for name in _LAYER_NORMS:
                getattr(layer, name).copy_(norm(p + name + ".weight"))
            layer.self_attn.q_norm.copy_(norm(p + "self_attn.q_norm.weight"))
            layer.self_attn.k_norm.copy_(norm(p + "self_attn.k_norm.weight"))
            load_layer_linears(layer, weights, p)


_GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def gguf_names_to_hf(
    tensors: dict[str, torch.Tensor], cfg: Gemma3Config
) -> dict[str, torch.Tensor]:
    def unfold(name: str, tensor: torch.Tensor) -> torch.Tensor:
        # llama.cpp's converter stores every Gemma norm as 1 + w; HF naming means w.
        return tensor - 1 if name.endswith("norm.weight") else tensor

    return hf_names_from_gguf(tensors, _GGUF_LAYER_NAMES, unfold)
