"""Weight bytes one rank holds, by kind, counted from the model built on the meta device (no
memory, no weights): every parameter and buffer the engine's model has, at the bytes the engine
holds it in, sliced as distributed/sharding.py slices it.

How each tensor is held:
- DeepSeek-V4 as shipped: the routed experts FP4 (0.5 byte a weight + an e8m0 byte per 32
  inputs), its other linears FP8 (1 byte + an fp32 scale per 128 x 128 block), except the
  compressor and indexer projections and the router, which DeepSeek ships in bf16 (transformers'
  `_keep_in_fp32_modules` for V4 lists them); a checkpoint without packed weights holds all
  floats in the engine's dtype.
- Everything not packed: floats in the engine's dtype (the runner casts the model to it), integer
  buffers as they are (V4's hash-routing table is int64).
- GGUF models: weights="int8"/"int4" swap the projections for QuantizedLinear (its codes, scales,
  zeros and the kernel's own copies: models/quantized_linear.py) and the head for int8; a head tied
  to the embedding gets its own int8 copy.

Tensor/expert parallel: the routed experts split by expert, the shared expert by its
intermediate rows, attention replicated (V4); heads and MLP columns split (llama, Gemma 3);
embedding and head split by vocabulary. Rank 0 holds the largest share (balanced_range).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, fields

import torch
from torch import nn

from inference.engine.distributed.parallel_layers import balanced_range
from inference.engine.distributed.sharding import head_shard
from inference.engine.memory_plan.model_spec import ModelSpec
from inference.engine.models.packed.formats import FP4_GROUP, FP8_BLOCK
from inference.engine.models.quantized_linear import INT4_GROUP_SIZE

# V4 linears DeepSeek ships in bf16 (no FP8 scale): transformers' _keep_in_fp32_modules for V4.
_V4_UNPACKED_LINEARS = (
    "compressor.kv_proj",
    "compressor.gate_proj",
    "indexer.kv_proj",
    "indexer.gate_proj",
    "scorer.weights_proj",
)
_LLAMA_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class WeightBytes:
    """Bytes one rank holds, by kind (the memory plan's rows; compare with a loaded model's)."""

    experts: int = 0  # routed experts (packed where the checkpoint ships them packed)
    linears: int = 0  # the other linear layers' weights (and their scales)
    embeddings: int = 0  # embedding and output head
    other: int = 0  # norms, routers, mHC, biases, rope tables, small unpacked projections

    @property
    def total(self) -> int:
        return self.experts + self.linears + self.embeddings + self.other

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class Sharding:
    """Which rank's share to count (rank 0: the largest)."""

    world_size: int = 1
    expert_parallel: bool = False
    rank: int = 0


def weight_bytes(
    spec: ModelSpec, dtype: torch.dtype, sharding: Sharding, weights: str = "fp32"
) -> WeightBytes:
    """The bytes rank `sharding.rank` holds, by kind. `weights`: the GGUF models' linear format
    (config.WEIGHT_FORMATS, "auto" resolved)."""
    if sharding.world_size > 1 and spec.arch == "deepseek_v4" and not sharding.expert_parallel:
        raise ValueError(
            "DeepSeek-V4 is split across ranks by its experts only (its attention is one KV "
            "head): give --enable-expert-parallel (enable_expert_parallel=True) with more ranks"
        )
    if sharding.expert_parallel and spec.arch != "deepseek_v4":
        raise ValueError(f"enable_expert_parallel splits MoE experts; {spec.arch} has none")
    if weights not in ("fp32", "int8", "int4"):
        raise ValueError(
            f"weights must be fp32, int8 or int4 here (auto resolved), got {weights!r}"
        )
    model = meta_model(spec)
    totals = dict.fromkeys(("experts", "linears", "embeddings", "other"), 0)
    for _, kind, size, _ in tensor_bytes(spec, model, dtype, sharding, weights):
        totals[kind] += size
    named = [*model.named_parameters(), *model.named_buffers()]
    tied = spec.arch != "deepseek_v4" and spec.config.tie_word_embeddings
    if tied and weights != "fp32" and not any(name == "lm_head.weight" for name, _ in named):
        # Gemma 3's TiedLMHead: quantize_model gives the head an int8 copy of the embedding.
        head = _vocab_rows(spec.config.vocab_size, sharding), spec.config.hidden_size
        totals["embeddings"] += _quantized_bytes(*head, "int8")
    return WeightBytes(**totals)


def tensor_bytes(
    spec: ModelSpec, model: nn.Module, dtype: torch.dtype, sharding: Sharding, weights: str
) -> Iterator[tuple[str, str, int, torch.Tensor]]:
    """(name, kind, bytes rank `sharding.rank` holds, the meta tensor) of each parameter and
    buffer of `model` (`meta_model(spec)`): weight_bytes' rows before they are summed."""
    count = _deepseek_v4_tensor if spec.arch == "deepseek_v4" else _llama_tensor
    linear_names = {
        f"{name}.weight" for name, module in model.named_modules() if isinstance(module, nn.Linear)
    }
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        kind, size = count(spec, name, tensor, name in linear_names, dtype, sharding, weights)
        yield name, kind, size, tensor


def meta_model(spec: ModelSpec) -> nn.Module:
    """The engine's model of `spec` on the meta device: shapes, no memory."""
    from inference.engine.models import ARCHITECTURES
    from inference.engine.models.skipped_init import skipped_init

    with torch.device("meta"), skipped_init():
        return ARCHITECTURES[spec.arch][1](spec.config)


def _held(tensor: torch.Tensor, dtype: torch.dtype, numel: int | None = None) -> int:
    """Bytes of an unpacked tensor as the engine holds it: floats in its dtype."""
    size = tensor.dtype.itemsize if not tensor.is_floating_point() else dtype.itemsize
    return (tensor.numel() if numel is None else numel) * size


def _vocab_rows(vocab: int, sharding: Sharding) -> int:
    return len(balanced_range(vocab, sharding.rank, sharding.world_size))


# ---- DeepSeek-V4 ------------------------------------------------------------------------------


def _deepseek_v4_tensor(spec, name, tensor, is_linear, dtype, sharding, weights):
    formats, world, rank = spec.formats, sharding.world_size, sharding.rank
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
        num_experts, rows, cols = tensor.shape
        mine = len(balanced_range(num_experts, rank, world))
        return "experts", mine * _packed_bytes(formats.experts, rows, cols, tensor, dtype)
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        rows = _vocab_rows(tensor.shape[0], sharding)
        return "embeddings", _held(tensor, dtype, rows * tensor.shape[1])
    if not is_linear or any(part in name for part in _V4_UNPACKED_LINEARS):
        return "other", _held(tensor, dtype)
    rows, cols = tensor.shape
    row_range, col_range = range(rows), range(cols)
    if ".shared_experts." in name and world > 1:  # intermediate split: gate/up rows, down columns
        if leaf == "weight" and ".down_proj." in name:
            col_range = balanced_range(cols, rank, world)
        else:
            row_range = balanced_range(rows, rank, world)
    if formats.linears is None:
        return "linears", len(row_range) * len(col_range) * dtype.itemsize
    return "linears", _fp8_slice_bytes(row_range, col_range)


def _packed_bytes(fmt: str | None, rows: int, cols: int, tensor, dtype) -> int:
    """One expert's (rows, cols) weight as held."""
    if fmt == "fp4":
        if cols % FP4_GROUP:
            raise ValueError(f"FP4 experts need inputs in groups of {FP4_GROUP}, got {cols}")
        return rows * cols // 2 + rows * cols // FP4_GROUP
    if fmt == "fp8":
        return _fp8_slice_bytes(range(rows), range(cols))
    return _held(tensor, dtype, rows * cols)


def _fp8_slice_bytes(rows: range, cols: range) -> int:
    """FP8 bytes of a slice of a weight and its fp32 scales: every 128 x 128 block it touches."""

    def blocks(r: range) -> int:
        return math.ceil(r.stop / FP8_BLOCK) - r.start // FP8_BLOCK if len(r) else 0

    return len(rows) * len(cols) + 4 * blocks(rows) * blocks(cols)


# ---- llama family and Gemma 3 -----------------------------------------------------------------


def _llama_tensor(spec, name, tensor, is_linear, dtype, sharding, weights):
    config, world, rank = spec.config, sharding.world_size, sharding.rank
    leaf_module = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else name
    if name in ("embed_tokens.weight", "lm_head.weight"):
        rows = _vocab_rows(tensor.shape[0], sharding)
        if name == "lm_head.weight" and weights != "fp32":
            return "embeddings", _quantized_bytes(rows, tensor.shape[1], "int8")
        return "embeddings", _held(tensor, dtype, rows * tensor.shape[1])
    if not (is_linear and leaf_module in _LLAMA_PROJECTIONS):
        return "other", _held(tensor, dtype)
    rows, cols = tensor.shape
    if world > 1:
        rows, cols = _llama_shard(leaf_module, config, rows, cols, rank, world)
    if weights != "fp32":
        return "linears", _quantized_bytes(rows, cols, weights)
    return "linears", rows * cols * dtype.itemsize


def _llama_shard(module: str, config, rows: int, cols: int, rank: int, world: int):
    """The (rows, cols) of this rank's slice (sharding.py: Megatron's plan)."""
    heads = head_shard(config.num_heads, config.num_kv_heads, rank, world)
    d = config.head_dim
    if module == "qkv_proj":
        return (len(heads.q_heads) + 2 * len(heads.kv_heads)) * d, cols
    if module == "o_proj":
        return rows, len(heads.q_heads) * d
    mine = len(balanced_range(config.intermediate_size, rank, world))
    return (2 * mine, cols) if module == "gate_up_proj" else (rows, mine)


def _quantized_bytes(rows: int, cols: int, fmt: str) -> int:
    """A QuantizedLinear's buffers and kernel copies (models/quantized_linear.py)."""
    if fmt == "int8":  # codes, fp32 scales and zeros, bf16 kernel scales
        return rows * cols + rows * (4 + 4 + 2)
    groups = cols // INT4_GROUP_SIZE
    # int8 codes, the kernel's packed nibbles, fp32 scales and zeros, bf16 (scale, zero) pairs
    return rows * cols + rows * cols // 2 + rows * groups * (4 + 4) + groups * rows * 2 * 2


def held_bytes(model: nn.Module) -> int:
    """Bytes a loaded model holds: its parameters and buffers (each storage once) and the
    tensors QuantizedLinear keeps as plain attributes (its kernel scales). What the plan's
    `weight_bytes(...).total` predicts for a model loaded as the engine loads it."""
    seen: set[tuple[int, int]] = set()
    total = 0
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [
        module.kernel_scales for module in model.modules() if hasattr(module, "kernel_scales")
    ]
    for tensor in tensors:
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    return total
