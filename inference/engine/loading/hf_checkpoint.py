"""Loading a Hugging Face checkpoint directory: config.json, *.safetensors, tokenizer.json.

The same architecture modules serve it as serve GGUF files; only names and metadata differ.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tokenizers
import torch
from safetensors.torch import load_file

from inference.engine.loading.tokenizer import Tokenizer

HF_MODEL_TYPES = {"llama": "llama", "deepseek_v4": "deepseek_v4"}


def is_hf_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def read_hf_config(path: Path) -> dict[str, Any]:
    config = json.loads((path / "config.json").read_text())
    if config.get("model_type") not in HF_MODEL_TYPES:
        raise ValueError(
            f"{path}/config.json has model_type {config.get('model_type')!r}; "
            f"supported: {sorted(HF_MODEL_TYPES)}"
        )
    return config


def read_hf_weights(path: Path, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no .safetensors files in {path}")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        # Integer tensors (DeepSeek-V4's hash-routing table, packed FP4) and 1-byte floats
        # (FP8 weights, e8m0 scales) keep their type: the model dequantizes them.
        tensors = load_file(str(file))
        weights.update({k: v.to(dtype) if _is_wide_float(v) else v for k, v in tensors.items()})
    return weights


def _is_wide_float(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() and tensor.element_size() > 1


def has_hf_tokenizer(path: Path) -> bool:
    return (path / "tokenizer.json").is_file()


def read_hf_tokenizer(path: Path) -> Tokenizer:
    tokenizer_file = path / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ValueError(
            f"{path} has no tokenizer.json: its model serves prompts given as token ids only; "
            "copy the model's tokenizer.json (and tokenizer_config.json) there for text"
        )
    backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    settings_file = path / "tokenizer_config.json"
    settings = json.loads(settings_file.read_text()) if settings_file.is_file() else {}
    vocab_size = backend.get_vocab_size(with_added_tokens=True)
    vocab = [backend.id_to_token(i) or "" for i in range(vocab_size)]

    def token_id(key: str) -> int | None:
        token = settings.get(key)
        if isinstance(token, dict):
            token = token.get("content")
        return backend.token_to_id(token) if token else None

    eos = token_id("eos_token")
    if eos is None:
        raise ValueError(f"{settings_file} must name an eos_token present in tokenizer.json")
    return Tokenizer(
        backend=backend,
        vocab=vocab,
        bos_token_id=token_id("bos_token"),
        eos_token_id=eos,
        add_bos_token=bool(settings.get("add_bos_token", False)),
        add_eos_token=bool(settings.get("add_eos_token", False)),
        chat_template=settings.get("chat_template"),
    )
