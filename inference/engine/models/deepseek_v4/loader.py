"""Loading a DeepSeek-V4 checkpoint directory tensor by tensor, its FP8 linears and FP4 experts
kept packed (packed/), each rank reading only its share of the routed experts.

1. `index_checkpoint` reads the safetensors headers only (names, dtypes, shapes) and checks
   everything that can be wrong before a byte of data is read: every name maps to the model
   (deepseek_v4.weights: any of the three layouts), every quantized weight has its scale and the
   scale grid fits it, FP4 widths are whole, no tensor of the model is missing. A bad
   checkpoint raises ValueError naming the tensor; nothing is half-loaded.
2. `build_model` constructs the model on the meta device (no storage), puts packed modules
   where the checkpoint's weights are packed, and allocates only the experts' packed tensors
   (filled expert by expert): no fp32 copy of a packed weight exists at any point.
3. `stream_weights` walks the shards one at a time (safe_open), reads each tensor (a rank's
   slice of stacked experts through get_slice), converts and places it.

Peak host memory ≈ what the model holds + one tensor + the open shard's pages read so far.

Dtypes: packed weights stay in their bytes on every device. Other float tensors (embeddings,
head, norms, mHC, router, compressor biases; V4 Flash: ~7 GB of 154 in bf16) become fp32 on the
CPU, where the engine computes in fp32 (no fast bf16 there), and stay bf16 on CUDA, where the
runner computes in bf16.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from inference.engine.loading.shard import Shard
from inference.engine.models.deepseek_v4.attention import GroupedLinear
from inference.engine.models.deepseek_v4.config import DeepseekV4Config
from inference.engine.models.deepseek_v4.model import DeepseekV4ForCausalLM, rotary_embeddings
from inference.engine.models.deepseek_v4.moe import Experts
from inference.engine.models.deepseek_v4.weights import SCALE_SUFFIXES, ModelName, model_name
from inference.engine.models.logits_head import LogitsHead
from inference.engine.models.packed.experts import PROJECTIONS, Fp4Experts
from inference.engine.models.packed.formats import check_fp4, check_fp8
from inference.engine.models.packed.linear import Fp8GroupedLinear, Fp8Linear
from inference.engine.models.skipped_init import skipped_init

logger = logging.getLogger(__name__)

# safetensors' dtype names → torch's (what a header says, without reading the data)
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_PACKED_DTYPES = {"F8_E4M3", "F8_E5M2", "I8", "U8", "F4"}


@dataclass(frozen=True, slots=True)
class Source:
    """One tensor of one shard, as its header describes it."""

    file: Path
    name: str
    dtype: str  # safetensors' name
    shape: tuple[int, ...]

    def meta(self) -> torch.Tensor:
        """A storage-less tensor of this dtype and shape (for the format checks)."""
        if self.dtype == "F4":  # torch's float4 pair type: two values a byte, as uint8 here
            return torch.empty(self.shape, dtype=torch.uint8, device="meta")
        return torch.empty(self.shape, dtype=_DTYPES[self.dtype], device="meta")


@dataclass(slots=True)
class CheckpointIndex:
    """What the checkpoint holds, under the model's names (headers only)."""

    config: DeepseekV4Config
    plain: dict[str, Source] = field(default_factory=dict)  # model tensor → source
    fp8: dict[str, tuple[Source, Source]] = field(default_factory=dict)  # module → weight, scale
    # experts module → (expert, w1/w3/w2) → (weight, its scale; None for a dense float weight)
    experts: dict[str, dict[tuple[int, str], tuple[Source, Source | None]]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    tied_head: bool = False  # lm_head.weight is the embedding's
    # The config declares an MTP layer the checkpoint lacks (transformers' save_pretrained
    # writes none): the model is built without it (no MTP drafts).
    without_mtp: bool = False

    def is_fp4(self, experts_module: str) -> bool:
        return any(scale is not None for _, scale in self.experts[experts_module].values())


def index_checkpoint(path: Path, config: DeepseekV4Config) -> CheckpointIndex:
    """The checkpoint's tensors mapped to the model and checked (ValueError naming the first
    tensor that does not fit; see the module docstring)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no .safetensors files in {path}")
    headers: dict[str, Source] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                piece = f.get_slice(name)
                headers[name] = Source(file, name, piece.get_dtype(), tuple(piece.get_shape()))
    with torch.device("meta"), skipped_init():
        skeleton = DeepseekV4ForCausalLM(config)
    tensors = {n: t for n, t in skeleton.state_dict().items()}
    experts_modules = {n for n, m in skeleton.named_modules() if isinstance(m, Experts)}
    index = CheckpointIndex(config)
    scales = {_scale_of(name, headers) for name in headers if _is_packed_weight(headers[name])}
    unknown = []
    for name, source in headers.items():
        if name in scales:
            continue
        target = model_name(name, set(tensors), experts_modules)
        if target is None:
            if not skeleton.has_mtp and _is_mtp(name):
                continue  # the config declares no MTP layer: its tensors are not loaded
            for suffix in SCALE_SUFFIXES:
                weight = name.removesuffix(suffix) + ".weight"
                if name.endswith(suffix) and weight not in headers:
                    raise ValueError(f"{name}: a scale whose weight {weight} is not in {path}")
            unknown.append(name)
            continue
        _add(index, target, source, headers, skeleton, tensors)
    if unknown:
        raise ValueError(
            f"{path}: {len(unknown)} tensors match no DeepSeek-V4 layout for its config.json "
            f"(DeepSeek's names, transformers' or save_pretrained's): {unknown[:5]}"
        )
    _check_complete(index, skeleton, tensors, experts_modules)
    return index


def _is_mtp(name: str) -> bool:
    return name.startswith(("mtp.", "model.mtp."))


def _is_packed_weight(source: Source) -> bool:
    return source.name.endswith(".weight") and source.dtype in _PACKED_DTYPES


def _scale_of(weight_name: str, headers: dict[str, Source]) -> str:
    base = weight_name.removesuffix(".weight")
    for suffix in SCALE_SUFFIXES:
        if base + suffix in headers:
            return base + suffix
    raise ValueError(
        f"{weight_name} is packed ({headers[weight_name].dtype}) but the checkpoint has no "
        f"scale for it: expected {base}.scale or {base}.weight_scale_inv"
    )


def _add(index, target: ModelName, source: Source, headers, skeleton, tensors) -> None:
    packed = _is_packed_weight(source)
    scale = headers[_scale_of(source.name, headers)] if packed else None
    if target.expert is not None:
        experts = skeleton.get_submodule(target.name)
        if packed:
            if source.dtype not in ("I8", "U8", "F4"):
                raise ValueError(f"{source.name}: routed experts must be FP4, got {source.dtype}")
            check_fp4(source.name, source.meta(), scale.meta())
        _check_expert_shape(source, target, experts, packed)
        index.experts[target.name][target.expert, target.which] = (source, scale)
        return
    if packed:
        module_name = target.name.removesuffix(".weight")
        module = skeleton.get_submodule(module_name) if target.name.endswith(".weight") else None
        if not isinstance(module, nn.Linear):
            raise ValueError(
                f"{source.name}: packed ({source.dtype}) weights are supported for linear "
                f"layers; it maps to {target.name} ({type(module).__name__})"
            )
        check_fp8(source.name, source.meta(), scale.meta())
        if source.shape != tuple(module.weight.shape):
            raise ValueError(
                f"{source.name}: FP8 weight {source.shape}, the model expects "
                f"{tuple(module.weight.shape)}"
            )
        index.fp8[module_name] = (source, scale)
        return
    want = tuple(tensors[target.name].shape)
    if source.shape != want:
        raise ValueError(f"{source.name}: shape {source.shape}, the model expects {want}")
    index.plain[target.name] = source


def _check_expert_shape(source: Source, target: ModelName, experts: Experts, packed: bool) -> None:
    i, d = experts.down_proj.shape[-1], experts.down_proj.shape[-2]
    out_in = (d, i) if target.which == "w2" else (i, d)
    want = (out_in[0], out_in[1] // 2) if packed else out_in
    if source.shape != want:
        kind = "packed FP4 (out, in / 2) bytes" if packed else "(out, in)"
        raise ValueError(f"{source.name}: shape {source.shape}, expected {want} {kind}")
    if target.expert >= experts.gate_up_proj.shape[0]:
        raise ValueError(
            f"{source.name}: expert {target.expert}, the config has {experts.gate_up_proj.shape[0]}"
        )


def _check_complete(index, skeleton, tensors, experts_modules) -> None:
    covered = set(index.plain) | {f"{m}.weight" for m in index.fp8}
    for module in experts_modules:
        if module in index.experts:
            count = skeleton.get_submodule(module).gate_up_proj.shape[0]
            want = {(e, w) for e in range(count) for w in PROJECTIONS}
            missing = sorted(want - set(index.experts[module]))
            if missing:
                raise ValueError(
                    f"{module}: the checkpoint lacks {len(missing)} expert projections, "
                    f"e.g. expert {missing[0][0]}'s {missing[0][1]}"
                )
            kinds = {scale is None for _, scale in index.experts[module].values()}
            if len(kinds) > 1:
                raise ValueError(f"{module}: some experts are FP4 and some are not")
            covered |= {f"{module}.gate_up_proj", f"{module}.down_proj"}
    if "lm_head.weight" not in covered and skeleton.config.tie_word_embeddings:
        index.tied_head = True
        covered.add("lm_head.weight")
    missing = sorted(set(tensors) - covered)
    if skeleton.has_mtp and not any(n.startswith("mtp.") for n in covered):
        index.without_mtp = True
        logger.warning("config.json declares an MTP layer the checkpoint lacks: loaded without it")
    if not skeleton.has_mtp or index.without_mtp:
        missing = [n for n in missing if not n.startswith("mtp.")]
    if missing:
        raise ValueError(
            f"this DeepSeek-V4 checkpoint does not match its config.json: it lacks "
            f"{len(missing)} of the model's tensors, e.g. {missing[:5]}"
        )


# ---- building and streaming ---------------------------------------------------------------------


def load_deepseek_v4(
    path: Path, config: DeepseekV4Config, device: torch.device, shard: Shard | None = None
) -> DeepseekV4ForCausalLM:
    """The model of checkpoint `path` on `device` (see the module docstring)."""
    index = index_checkpoint(path, config)
    model = build_model(index, device, shard)
    stream_weights(model, index, device)
    if device.type == "cpu":  # compiled (or read from numba's cache) now, not in the first step
        from inference.engine.models.deepseek_v4 import hyper_connections_cpu, norms_cpu

        hyper_connections_cpu.warm()
        norms_cpu.warm()
        if isinstance(model.lm_head, LogitsHead):  # the faster logits head on this machine
            logger.info("%s", model.lm_head.choose())
    return model


def float_dtype(device: torch.device) -> torch.dtype:
    """What non-packed float tensors are held as (the module docstring says why)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def build_model(
    index: CheckpointIndex, device: torch.device, shard: Shard | None = None
) -> DeepseekV4ForCausalLM:
    """The model's skeleton: everything on meta except the experts' storage (allocated,
    unfilled) and the rotary tables; packed modules where the checkpoint is packed."""
    config = index.config
    with torch.device("meta"), skipped_init():
        model = DeepseekV4ForCausalLM(config)
    model.rotary = rotary_embeddings(config).to(device)
    if index.without_mtp:
        model.mtp = nn.ModuleList()
    for name, (_, scale) in index.fp8.items():
        old = model.get_submodule(name)
        e8m0 = scale.dtype in ("U8", "F8_E8M0")
        if isinstance(old, GroupedLinear):
            new = Fp8GroupedLinear(
                old.in_features, old.out_features, old.n_groups, scale_is_e8m0=e8m0, device="meta"
            )
        else:
            new = Fp8Linear(old.in_features, old.out_features, scale_is_e8m0=e8m0, device="meta")
        model.set_submodule(name, new)
    for name, old in list(model.named_modules()):
        if not isinstance(old, Experts):
            continue
        ids = range(old.gate_up_proj.shape[0])
        if shard is not None and name.startswith("model.layers."):
            ids = _balanced(len(ids), shard)
        if name not in index.experts:  # stacked in the checkpoint: read as slices
            with torch.device("meta"), skipped_init():
                new = Experts(config, ids)
        elif index.is_fp4(name):
            new = Fp4Experts(
                config.hidden_size, config.moe_intermediate_size, old.limit, ids, device=device
            )
        else:
            with torch.device("meta"), skipped_init():
                new = Experts(config, ids)
            for leaf in ("gate_up_proj", "down_proj"):
                shape = getattr(new, leaf).shape
                empty = torch.empty(shape, dtype=float_dtype(device), device=device)
                setattr(new, leaf, nn.Parameter(empty, requires_grad=False))
        model.set_submodule(name, new)
    return model


def _balanced(total: int, shard: Shard) -> range:
    from inference.engine.distributed.parallel_layers import balanced_range

    return balanced_range(total, shard.rank, shard.world_size)


@torch.inference_mode()
def stream_weights(model: DeepseekV4ForCausalLM, index: CheckpointIndex, device) -> None:
    """Read every tensor the model holds, shard by shard, and place it; packed scales first
    (small: one e8m0 byte per 16 packed bytes, fp32 per 128 x 128 FP8 block)."""
    scales: dict[str, torch.Tensor] = {}
    plan: dict[Path, list] = defaultdict(list)
    for name, source in index.plain.items():
        plan[source.file].append(("plain", name, source))
    for name, (weight, scale) in index.fp8.items():
        plan[weight.file].append(("fp8", name, weight))
        plan[scale.file].append(("scale", None, scale))
    for name, projections in index.experts.items():
        held = model.get_submodule(name).expert_ids
        for (expert, which), (weight, scale) in projections.items():
            if expert in held:
                plan[weight.file].append(("expert", (name, expert, which), weight))
                if scale is not None:
                    plan[scale.file].append(("scale", None, scale))
    for file in sorted(plan):  # scales first
        with safe_open(str(file), framework="pt") as f:
            for kind, _, source in plan[file]:
                if kind == "scale":
                    scales[source.name] = _owned(f.get_tensor(source.name), torch.device("cpu"))
    dtype = float_dtype(device)
    for file in sorted(plan):
        with safe_open(str(file), framework="pt") as f:
            for kind, target, source in plan[file]:
                if kind == "scale":
                    continue
                if kind == "plain":
                    tensor = _read(f, source.name, model, target)
                    _assign(model, target, _converted(tensor, dtype, device))
                    continue
                tensor = f.get_tensor(source.name)
                if kind == "fp8":
                    scale = scales[index.fp8[target][1].name]
                    model.get_submodule(target).set_packed(
                        source.name, _owned(tensor, device), scale.to(device)
                    )
                else:
                    _place_expert(model, index, target, source, tensor, scales, dtype)
    if index.tied_head:
        model.lm_head.weight = model.model.embed_tokens.weight
    left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left:  # the index's completeness check makes this unreachable; a guard, not a path
        raise ValueError(f"tensors left unloaded: {left[:5]}")


def _read(f, name: str, model: nn.Module, target: str) -> torch.Tensor:
    """The tensor, or for stacked experts the rows of the experts this rank holds."""
    owner = model.get_submodule(target.rpartition(".")[0])
    if isinstance(owner, Experts):
        held = owner.expert_ids
        return f.get_slice(name)[held.start : held.stop]
    return f.get_tensor(name)


def _place_expert(model, index, target, source, tensor, scales, dtype) -> None:
    name, expert, which = target
    experts = model.get_submodule(name)
    scale = index.experts[name][expert, which][1]
    if scale is not None:
        device = experts.gate_up.device
        experts.set_projection(
            source.name, expert, which, tensor.to(device), scales[scale.name].to(device)
        )
        return
    local = expert - experts.expert_ids.start
    i = experts.down_proj.shape[-1]
    rows = {"w1": slice(0, i), "w3": slice(i, 2 * i), "w2": slice(None)}[which]
    target_tensor = (experts.down_proj if which == "w2" else experts.gate_up_proj).data
    target_tensor[local, rows].copy_(tensor.to(dtype))


def _converted(tensor: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if tensor.is_floating_point() and tensor.element_size() > 1:
        return _owned(tensor.to(dtype), device)
    return _owned(tensor, device)


def _owned(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device` in storage of its own: safe_open's tensors are views of the shard's
    memory map, and one kept would keep the whole shard's pages mapped (resident)."""
    moved = tensor.to(device)
    shared = moved.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
    return moved.clone() if shared else moved


def _assign(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner)
    if leaf in module._parameters:
        module._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)
    else:
        expected = module._buffers[leaf].dtype
        module._buffers[leaf] = tensor if tensor.dtype == expected else tensor.to(expected)
