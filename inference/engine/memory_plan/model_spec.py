"""A model name → what the memory plan needs of it, from its config alone (no weights read):
the architecture, its config dataclass, its context, and the packed formats its weights are
held in.

Names: the engine's own (`known_model_names()`: bundled GGUF files, their tiny random variants,
`deepseek-v4-tiny-random`), a .gguf path or Hugging Face checkpoint directory, and
`deepseek-v4-flash`: DeepSeek V4 Flash's published config (flash_config.json, shipped without
weights; transformers' `DeepseekV4Config()` defaults reproduce it).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.engine.loading.gguf_file import open_gguf, read_metadata
from inference.engine.loading.hf_checkpoint import HF_MODEL_TYPES, is_hf_checkpoint
from inference.engine.loading.model_files import (
    TINY_RANDOM_MODELS,
    gguf_path_for,
    known_model_names,
)
from inference.engine.models.deepseek_v4.config import DeepseekV4Config
from inference.engine.models.gemma3 import Gemma3Config
from inference.engine.models.llama import LlamaConfig

FLASH_NAME = "deepseek-v4-flash"
FLASH_CONFIG = Path(__file__).parents[1] / "models" / "deepseek_v4" / "flash_config.json"
_TINY_V4_NAME = "deepseek-v4-tiny-random"
_CONFIGS = {"llama": LlamaConfig, "gemma3": Gemma3Config, "deepseek_v4": DeepseekV4Config}
_FLOAT8 = ("F8_E4M3", "F8_E5M2", "float8_e4m3fn", "float8_e5m2")
_PACKED4 = ("I8", "U8", "F4", "int8", "uint8", "float4_e2m1fn_x2")


@dataclass(frozen=True, slots=True)
class PackedFormats:
    """How a checkpoint ships its weights, as the engine holds them: "fp4" (e2m1 + an e8m0
    byte per 32 inputs), "fp8" (e4m3 + an fp32 scale per 128 x 128 block) or None (floats,
    held in the engine's dtype)."""

    experts: str | None = None
    linears: str | None = None


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    arch: str  # "llama" | "gemma3" | "deepseek_v4"
    config: Any  # the architecture's config dataclass
    max_model_len: int
    formats: PackedFormats = PackedFormats()


def model_spec(name: str) -> ModelSpec:
    """The spec of a model the engine serves, or ValueError naming what is known."""
    if name == FLASH_NAME:
        return _hf_spec(name, json.loads(FLASH_CONFIG.read_text()), None)
    if name == _TINY_V4_NAME:
        from inference.engine.models.deepseek_v4 import tiny

        vocab = _gguf_vocab_size(gguf_path_for(tiny.TOKENIZER_MODEL))
        return _hf_spec(name, {**tiny.TINY_CONFIG, "vocab_size": vocab}, None)
    try:
        path = gguf_path_for(name)
    except ValueError as error:
        raise ValueError(
            f"the memory plan does not know model {name!r}: use one of "
            f"{[*known_model_names(), FLASH_NAME]}, a .gguf path or a checkpoint directory "
            f"with a config.json ({error})"
        ) from None
    if is_hf_checkpoint(path):
        config = json.loads((path / "config.json").read_text())
        return _hf_spec(name, config, path)
    return _gguf_spec(name, path)


def _hf_spec(name: str, hf: dict[str, Any], path: Path | None) -> ModelSpec:
    arch = HF_MODEL_TYPES.get(hf.get("model_type"))
    if arch is None:
        raise ValueError(
            f"the memory plan does not know model_type {hf.get('model_type')!r} of {name!r}; "
            f"known: {sorted(HF_MODEL_TYPES)}"
        )
    config = _CONFIGS[arch].from_hf_config(hf)
    formats = _formats_from_config(hf)
    if formats == PackedFormats() and path is not None:
        formats = _formats_from_headers(path)
    return ModelSpec(name, arch, config, config.max_position_embeddings, formats)


def _gguf_spec(name: str, path: Path) -> ModelSpec:
    metadata = _gguf_metadata(path)
    arch = metadata.get("general.architecture")
    if arch not in ("llama", "gemma3"):
        raise ValueError(
            f"the memory plan does not know architecture {arch!r} of {path}; known: "
            "llama, gemma3 (GGUF) and deepseek_v4 (checkpoint directories)"
        )
    config = _CONFIGS[arch].from_gguf_metadata(metadata, vocab_size=_gguf_vocab_size(path))
    if name in TINY_RANDOM_MODELS:  # the engine builds these at toy size (models.TINY_OVERRIDES)
        from inference.engine.models import TINY_OVERRIDES

        config = dataclasses.replace(config, **TINY_OVERRIDES[arch])
    return ModelSpec(name, arch, config, config.max_position_embeddings)


def _gguf_vocab_size(path: Path) -> int:
    return len(_gguf_metadata(path)["tokenizer.ggml.tokens"])  # what its tokenizer holds


def _gguf_metadata(path: Path) -> dict[str, Any]:
    """A GGUF file's metadata, parsed once per file version (~1 s for a 49k-token vocabulary;
    every engine start plans, and tests start many engines on the same files)."""
    stat = path.stat()
    return _parsed_metadata(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _parsed_metadata(path: str, size: int, mtime_ns: int) -> dict[str, Any]:
    return read_metadata(open_gguf(path))


def _formats_from_config(hf: dict[str, Any]) -> PackedFormats:
    """DeepSeek's config.json says it: quantization_config (FP8 linears, 128 x 128 blocks) and
    expert_dtype ("fp4"; V4.1 moves it inside quantization_config)."""
    quant = hf.get("quantization_config") or {}
    if quant.get("quant_method") != "fp8":
        return PackedFormats()
    experts = quant.get("expert_dtype") or hf.get("expert_dtype") or "fp8"
    if experts not in ("fp4", "fp8"):
        raise ValueError(f"expert_dtype {experts!r} is not one the engine holds (fp4, fp8)")
    return PackedFormats(experts=experts, linears="fp8")


def _formats_from_headers(path: Path) -> PackedFormats:
    """A checkpoint whose config.json does not say: the tensors' dtypes in the safetensors
    headers (read without the data)."""
    from safetensors import safe_open

    experts = linears = None
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (a safe_open handle is not a dict)
                if not key.endswith(".weight"):
                    continue
                dtype = str(handle.get_slice(key).get_dtype())
                packed = "fp4" if dtype in _PACKED4 else "fp8" if dtype in _FLOAT8 else None
                if packed is None:
                    continue
                if ".experts." in key:
                    experts = experts or packed
                else:
                    linears = linears or packed
    return PackedFormats(experts=experts, linears=linears)
