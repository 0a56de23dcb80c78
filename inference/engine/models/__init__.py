"""Model registry: architecture name → module, and loading a model (weights + tokenizer).

`load_model` is the one entry point the runner uses; it returns everything the engine needs
to know about a model, without the engine touching GGUF or architecture details.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from inference.engine.loading.gguf_file import open_gguf, read_metadata, read_tensors
from inference.engine.loading.hf_checkpoint import (
    HF_MODEL_TYPES,
    has_hf_tokenizer,
    is_hf_checkpoint,
    read_hf_config,
    read_hf_tokenizer,
    read_hf_weights,
)
from inference.engine.loading.model_files import TINY_RANDOM_MODELS, gguf_path_for
from inference.engine.loading.shard import Shard
from inference.engine.loading.tokenizer import Tokenizer
from inference.engine.models import deepseek_v4, gemma3, llama
from inference.engine.models.deepseek_v4 import tiny as deepseek_v4_tiny
from inference.engine.models.deepseek_v4.loader import load_deepseek_v4
from inference.engine.models.quantized_linear import quantize_model
from inference.engine.models.skipped_init import skipped_init

logger = logging.getLogger(__name__)

ARCHITECTURES = {
    "llama": (llama.LlamaConfig, llama.LlamaForCausalLM, llama.gguf_names_to_hf),
    "gemma3": (gemma3.Gemma3Config, gemma3.Gemma3ForCausalLM, gemma3.gguf_names_to_hf),
    # Hugging Face checkpoints only (no GGUF names).
    "deepseek_v4": (deepseek_v4.DeepseekV4Config, deepseek_v4.DeepseekV4ForCausalLM, None),
}

# Small enough that a test step takes milliseconds, big enough to exercise GQA and RoPE.
_TINY_DIMS = dict(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16)
TINY_OVERRIDES = {
    "llama": dict(_TINY_DIMS, num_layers=2),
    # One period of the real pattern (5 sliding, 1 global) and the real window, so window
    # masking and the sliding-layer cache are exercised at production sizes.
    "gemma3": dict(
        _TINY_DIMS,
        num_layers=6,
        layer_types=("sliding",) * 5 + ("full",),
        query_pre_attn_scalar=16.0,
    ),
}


# Architectures whose projections can run as QuantizedLinear (weights="int8" / "int4").
QUANTIZABLE = ("llama", "gemma3")
# What weights="auto" resolves to on the CPU: the fastest format whose greedy town decisions
# agreed with fp32 on ≥ 95% of the prompts. Measured (docs/PERFORMANCE.md, issue 19's section;
# 12 town prompts): int4 92% (11/12), int8 83%: neither qualifies, so fp32. Change it here when
# a larger agreement run (bench.weights_agreement) puts a format at ≥ 95%.
AUTO_CPU_WEIGHTS = "fp32"


def resolve_weights(weights: str, arch: str, device: torch.device) -> str:
    """The weight format a model runs: "auto" → AUTO_CPU_WEIGHTS on the CPU for a quantizable
    architecture, else fp32; an explicit int8/int4 on an architecture without it is an error."""
    if weights == "auto":
        return AUTO_CPU_WEIGHTS if device.type == "cpu" and arch in QUANTIZABLE else "fp32"
    if weights != "fp32" and arch not in QUANTIZABLE:
        raise ValueError(
            f"weights={weights!r} supports the architectures {QUANTIZABLE}, not {arch!r}; "
            "use weights='fp32' or 'auto'"
        )
    return weights


@dataclass(slots=True)
class LoadedModel:
    model: nn.Module
    config: Any  # the architecture's config dataclass
    tokenizer: Tokenizer | None  # None: a checkpoint without one serves token-id prompts only
    fingerprint: str  # part of every block hash: different weights never share KV
    max_model_len: int
    weights: str = "fp32"  # the format the linear layers run (resolve_weights)


def load_model(
    name: str,
    device: torch.device,
    seed: int = 0,
    weights: str = "fp32",
    shard: Shard | None = None,
) -> LoadedModel:
    """`shard`: under expert parallelism, the rank whose share of a DeepSeek-V4 checkpoint's
    routed experts is read (the rest of the split is distributed.sharding's, after loading);
    other models load whole and are split after."""
    started = time.monotonic()
    if name == deepseek_v4_tiny.NAME:  # written once as a checkpoint directory, then loaded as one
        return _load_hf_checkpoint(deepseek_v4_tiny.tiny_checkpoint(seed), device, weights, shard)
    path = gguf_path_for(name)
    if is_hf_checkpoint(path):
        return _load_hf_checkpoint(path, device, weights, shard)
    reader = open_gguf(path)
    metadata = read_metadata(reader)
    tokenizer = Tokenizer.from_gguf_metadata(metadata)
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"unsupported architecture {arch!r} in {path}; known: {sorted(ARCHITECTURES)}"
        )
    config_cls, model_cls, to_hf_names = ARCHITECTURES[arch]
    weights = resolve_weights(weights, arch, device)
    config = config_cls.from_gguf_metadata(metadata, vocab_size=tokenizer.vocab_size)
    fingerprint = hashlib.sha256(f"{path.name}:{path.stat().st_size}:{config}".encode()).hexdigest()

    if name in TINY_RANDOM_MODELS:
        config = dataclasses.replace(config, **TINY_OVERRIDES[arch])
        with skipped_init():  # every parameter is drawn below
            model = model_cls(config)
        _init_random(model, seed)
        fingerprint = hashlib.sha256(f"random:{seed}:{config}".encode()).hexdigest()
    else:
        with skipped_init():  # every parameter is loaded below
            model = model_cls(config)
        model.load_hf_weights(to_hf_names(read_tensors(reader), config))
    count = quantize_model(model, weights)
    model = model.to(device).eval()
    logger.info(
        "loaded %s (%s, %s weights: %d quantized layers) in %.1f s",
        name,
        arch,
        weights,
        count,
        time.monotonic() - started,
    )
    if weights != "fp32":  # KV computed with other weights is other KV
        fingerprint = hashlib.sha256(f"{fingerprint}:{weights}".encode()).hexdigest()
    return LoadedModel(
        model, config, tokenizer, fingerprint[:16], config.max_position_embeddings, weights
    )


def load_tokenizer(name: str, seed: int = 0) -> Tokenizer:
    """A model's tokenizer and chat template alone, without its weights: from a GGUF file's
    metadata, a checkpoint directory's tokenizer.json, or the generated tiny model's."""
    if name == deepseek_v4_tiny.NAME:
        return read_hf_tokenizer(deepseek_v4_tiny.tiny_checkpoint(seed))
    path = gguf_path_for(name)
    if is_hf_checkpoint(path):
        return read_hf_tokenizer(path)
    return Tokenizer.from_gguf_metadata(read_metadata(open_gguf(path)))


def _load_hf_checkpoint(
    path, device: torch.device, weights: str, shard: Shard | None = None
) -> LoadedModel:
    hf_config = read_hf_config(path)
    arch = HF_MODEL_TYPES[hf_config["model_type"]]
    config_cls, model_cls, _ = ARCHITECTURES[arch]
    weights = resolve_weights(weights, arch, device)
    config = config_cls.from_hf_config(hf_config)
    tokenizer = read_hf_tokenizer(path) if has_hf_tokenizer(path) else None
    if arch == "deepseek_v4":  # streamed, FP8/FP4 kept packed, this rank's experts only
        model = load_deepseek_v4(path, config, device, shard)
    else:
        with skipped_init():  # every parameter is loaded below
            model = model_cls(config)
        model.load_hf_weights(read_hf_weights(path))
        quantize_model(model, weights)
    sizes = sorted((p.name, p.stat().st_size) for p in path.glob("*.safetensors"))
    key = f"{path.resolve()}:{sizes}:{config}" + (f":{weights}" if weights != "fp32" else "")
    fingerprint = hashlib.sha256(key.encode()).hexdigest()
    return LoadedModel(
        model.to(device).eval(),
        config,
        tokenizer,
        fingerprint[:16],
        config.max_position_embeddings,
        weights,
    )


@torch.no_grad()
def _init_random(model: nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.rsplit(".", 1)[-1].endswith("norm"):  # norm multipliers start at 1
            param.fill_(1.0)
        else:
            param.copy_(
                torch.randn(param.shape, generator=generator) * 0.5 / param.shape[-1] ** 0.5
            )
