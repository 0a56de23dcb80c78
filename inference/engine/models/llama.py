"""The llama architecture (SmolLM2 and any llama-family checkpoint), built bottom-up.

Weights arrive as a dict in HF naming (model.layers.N.self_attn.q_proj.weight, ...);
gguf_names_to_hf maps a GGUF file's names and un-permutes its Q/K rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.attention.attention_backend import AttentionMetadata
from inference.engine.attention.paged_kv import PagedKVSpec


@dataclass(frozen=True, slots=True)
class PagedKVConfig:
    """The shape a plain-KV model's config (llama, Gemma 3) starts with, and what the config
    tells the engine about its KV cache (with the layer_types and sliding_window it adds)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def paged_state_spec(self) -> PagedKVSpec:
        """The engine's view of the KV cache: K and V per token in every layer."""
        return PagedKVSpec(self.layer_types, self.num_kv_heads, self.head_dim, self.sliding_window)

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * 4  # fp32 K and V

    @property
    def kv_bytes_per_token(self) -> int:
        return self.num_layers * self.kv_bytes_per_token_per_layer


@dataclass(frozen=True, slots=True)
class LlamaConfig(PagedKVConfig):
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool = True

    @classmethod
    def from_gguf_metadata(cls, md: dict[str, Any], vocab_size: int) -> LlamaConfig:
        arch = md["general.architecture"]
        hidden = int(md[f"{arch}.embedding_length"])
        heads = int(md[f"{arch}.attention.head_count"])
        return cls(
            vocab_size=int(md.get(f"{arch}.vocab_size", vocab_size)),
            hidden_size=hidden,
            intermediate_size=int(md[f"{arch}.feed_forward_length"]),
            num_layers=int(md[f"{arch}.block_count"]),
            num_heads=heads,
            num_kv_heads=int(md.get(f"{arch}.attention.head_count_kv", heads)),
            head_dim=int(md.get(f"{arch}.rope.dimension_count", hidden // heads)),
            rope_theta=float(md.get(f"{arch}.rope.freq_base", 10000.0)),
            rms_norm_eps=float(md.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            max_position_embeddings=int(md.get(f"{arch}.context_length", 2048)),
        )

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> LlamaConfig:
        if hf.get("rope_scaling"):
            raise ValueError(f"rope_scaling {hf['rope_scaling']!r} is not supported yet")
        heads = int(hf["num_attention_heads"])
        return cls(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or hf["hidden_size"] // heads),
            rope_theta=float(hf.get("rope_theta", 10000.0)),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        )

    @property
    def layer_types(self) -> tuple[str, ...]:
        return ("full",) * self.num_layers  # no sliding-window layers

    @property
    def sliding_window(self) -> int | None:
        return None


class RotaryEmbedding(nn.Module):
    """rotate-half RoPE (HF layout); cos/sin precomputed for every position once."""

    def __init__(self, head_dim: int, theta: float, max_positions: int) -> None:
        super().__init__()
        # Computed on the CPU whatever the default device (the model's .to() moves them): on the
        # meta device (the memory plan's model) these ops run torch's Python references, whose
        # first call imports torch._dynamo (2.6 s at every engine start).
        cpu = torch.device("cpu")
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float64, device=cpu) / head_dim
        inv_freq = 1.0 / theta**exponents
        angles = torch.arange(max_positions, dtype=torch.float64, device=cpu)[:, None] * inv_freq
        # (max_positions, head_dim): each half repeats the frequencies
        self.register_buffer("cos", torch.cat([angles.cos()] * 2, -1).float(), persistent=False)
        self.register_buffer("sin", torch.cat([angles.sin()] * 2, -1).float(), persistent=False)

    def at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the step's positions, (T, 1, head_dim) each: looked up once a step."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return apply_rope(x, self.at(positions))


def apply_rope(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x: (T, heads, head_dim), rotated at each row's position."""
    cos, sin = cos_sin
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.scale = cfg.head_dim**-0.5

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        qk, v = self.qkv_proj(x).split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        # Queries and keys rotated together: (T, H + KVH, D), then (T, H, D) and (T, KVH, D).
        qk = apply_rope(
            qk.view(num_tokens, self.num_heads + self.num_kv_heads, self.head_dim), cos_sin
        )
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        # Every sequence's new K/V is written before any attends: a request may reuse
        # blocks that another request in the same step is computing right now.
        meta.write_kv(k, v, kv_cache[0], kv_cache[1])
        out = meta.attend(q, k, v, kv_cache[0], kv_cache[1], self.scale)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class LlamaMLP(nn.Module):
    """Gated MLP, down(act(gate) * up): SiLU for llama (SwiGLU), tanh-GELU for Gemma (GeGLU)."""

    def __init__(self, cfg: Any, activation: Callable[[torch.Tensor], torch.Tensor] = F.silu):
        super().__init__()
        self.activation = activation
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(self.activation(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.eps = cfg.rms_norm_eps
        self.input_layernorm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.post_attention_layernorm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.self_attn = LlamaAttention(cfg)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x, cos_sin, kv_cache, meta) -> torch.Tensor:
        h = F.rms_norm(x, x.shape[-1:], self.input_layernorm, self.eps)
        x = x + self.self_attn(h, cos_sin, kv_cache, meta)
        h = F.rms_norm(x, x.shape[-1:], self.post_attention_layernorm, self.eps)
        return x + self.mlp(h)


class LlamaForCausalLM(nn.Module):
    has_mtp = False  # no multi-token-prediction layer to draft with

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,  # (N,) rows whose next-token logits are wanted
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # (T, hidden)
        cos_sin = self.rope.at(positions)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, cos_sin, kv_cache, meta)
        x = F.rms_norm(x[logits_indices], x.shape[-1:], self.norm, self.config.rms_norm_eps)
        return self.lm_head(x)  # (N, vocab)

    @torch.inference_mode()
    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load HF-named weights, fusing q/k/v and gate/up into single matmuls."""
        self.embed_tokens.weight.copy_(take_weight(weights, "model.embed_tokens.weight"))
        self.norm.copy_(take_weight(weights, "model.norm.weight"))
        head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
        self.lm_head.weight.copy_(head)
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            layer.input_layernorm.copy_(take_weight(weights, p + "input_layernorm.weight"))
            layer.post_attention_layernorm.copy_(
                take_weight(weights, p + "post_attention_layernorm.weight")
            )
            load_layer_linears(layer, weights, p)


def take_weight(weights: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in weights:
        raise ValueError(f"checkpoint is missing tensor {name!r}")
    return weights[name]


def load_layer_linears(layer: nn.Module, weights: dict[str, torch.Tensor], prefix: str) -> None:
    """A decoder layer's attention and MLP matmuls from HF names under `prefix`
    (model.layers.N.), q/k/v fused into qkv_proj and gate/up into gate_up_proj (llama, Gemma 3)."""
    attn, mlp = prefix + "self_attn.", prefix + "mlp."
    layer.self_attn.qkv_proj.weight.copy_(
        torch.cat([take_weight(weights, attn + f"{n}_proj.weight") for n in "qkv"], dim=0)
    )
    layer.self_attn.o_proj.weight.copy_(take_weight(weights, attn + "o_proj.weight"))
    gate_up = [take_weight(weights, mlp + f"{n}_proj.weight") for n in ("gate", "up")]
    layer.mlp.gate_up_proj.weight.copy_(torch.cat(gate_up, dim=0))
    layer.mlp.down_proj.weight.copy_(take_weight(weights, mlp + "down_proj.weight"))


def _unpermute_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """GGUF stores Q/K rows for interleaved-pair RoPE; bring them back to rotate-half order."""
    out_dim = w.shape[0]
    head_dim = out_dim // n_heads
    # (n_heads, head_dim/2, 2, in) → (n_heads, 2, head_dim/2, in)
    return w.reshape(n_heads, head_dim // 2, 2, -1).transpose(1, 2).reshape(out_dim, -1)


_GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def gguf_names_to_hf(tensors: dict[str, torch.Tensor], cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    def convert(name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name.endswith("self_attn.q_proj.weight"):
            return _unpermute_rope_rows(tensor, cfg.num_heads)
        if name.endswith("self_attn.k_proj.weight"):
            return _unpermute_rope_rows(tensor, cfg.num_kv_heads)
        return tensor

    return hf_names_from_gguf(tensors, _GGUF_LAYER_NAMES, convert)


def hf_names_from_gguf(
    tensors: dict[str, torch.Tensor],
    layer_names: dict[str, str],
    convert: Callable[[str, torch.Tensor], torch.Tensor],
) -> dict[str, torch.Tensor]:
    """A GGUF file's tensors under HF names (llama, Gemma 3): the embedding, final norm and
    lm_head when present, and each block's tensors named in `layer_names` (GGUF name within a
    block → HF name within a layer); `convert(hf_name, tensor)` undoes what the file's
    converter changed. Other tensors (rope tables, ...) are left out."""
    hf: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": tensors["token_embd.weight"],
        "model.norm.weight": convert("model.norm.weight", tensors["output_norm.weight"]),
    }
    if "output.weight" in tensors:
        hf["lm_head.weight"] = tensors["output.weight"]
    for name, tensor in tensors.items():
        if not name.startswith("blk."):
            continue
        _, index, rest = name.split(".", 2)
        if rest in layer_names:
            hf_name = f"model.layers.{index}.{layer_names[rest]}"
            hf[hf_name] = convert(hf_name, tensor)
    return hf
