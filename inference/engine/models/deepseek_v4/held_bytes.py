"""The bytes a loaded (or sharded) DeepSeek-V4 model holds, by kind: what the memory plan's
weight figures are checked against.

Kinds: `experts` (the routed experts: packed FP4 bytes + e8m0 scales, or dense floats),
`linears` (every other projection: FP8 bytes + block scales, or dense; the shared expert's
too), `embeddings` (the token embedding and the lm head, once if tied), `other` (norms, mHC,
router, biases, sinks, rotary tables). A storage shared by two tensors is counted once.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from inference.engine.models.deepseek_v4.moe import Experts
from inference.engine.models.packed.experts import Fp4Experts
from inference.engine.models.packed.linear import Fp8Linear


@dataclass(frozen=True, slots=True)
class HeldBytes:
    experts: int
    linears: int
    embeddings: int
    other: int

    @property
    def total(self) -> int:
        return self.experts + self.linears + self.embeddings + self.other


def _kind(name: str, module: nn.Module) -> str:
    if isinstance(module, Experts | Fp4Experts):
        return "experts"
    if name.endswith(("embed_tokens", "lm_head")):
        return "embeddings"
    if isinstance(module, Fp8Linear | nn.Linear) or name.endswith("_proj"):
        return "linears"  # name: distributed.parallel_layers' slices of a projection
    return "other"


def held_bytes(model: nn.Module) -> HeldBytes:
    totals = {"experts": 0, "linears": 0, "embeddings": 0, "other": 0}
    seen: set[int] = set()
    for name, module in model.named_modules():
        kind = _kind(name, module)
        for tensor in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
            if tensor.is_meta:
                continue
            storage = tensor.untyped_storage()
            if storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            totals[kind] += storage.nbytes()
    return HeldBytes(**totals)


def packed_files_bytes(path) -> int:
    """The bytes of a checkpoint directory's safetensors files."""
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))
