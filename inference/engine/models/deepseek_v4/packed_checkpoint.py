"""Writing a DeepSeek-V4 checkpoint as DeepSeek ships one, for tests and benches: its own names,
every linear of the layers (and of the MTP layer) in FP8 with 128 x 128 block scales, the
routed experts per expert in FP4 with e8m0 scales per 32 inputs, the rest (embeddings, head,
norms, mHC, router, biases) in bf16, `tid2eid` int64; sharded into files of at most
`max_shard_bytes`; config.json, and no tokenizer (its model serves token-id prompts).

The packed bytes are drawn directly (random FP4 codes, randn cast to e4m3) with scales that give
weights ~0.5/√fan_in, so a checkpoint of any size is written in seconds, one tensor at a time,
without ever building the model in floats.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from inference.engine.models.deepseek_v4.config import DeepseekV4Config
from inference.engine.models.deepseek_v4.model import DeepseekV4ForCausalLM
from inference.engine.models.deepseek_v4.moe import Experts
from inference.engine.models.packed.formats import FP4_GROUP, FP8_BLOCK, fp8_scale_grid
from inference.engine.models.skipped_init import skipped_init

# The model's (transformers') names → DeepSeek's, applied in order (weights._RENAMES reversed).
_TO_DEEPSEEK = [
    (".self_attn.compressor.indexer.scorer.weights_proj.", ".attn.indexer.weights_proj."),
    (".self_attn.compressor.indexer.q_b_proj.", ".attn.indexer.wq_b."),
    (".self_attn.compressor.indexer.", ".attn.indexer.compressor."),
    (".self_attn.", ".attn."),
    (".compressor.kv_norm.", ".compressor.norm."),
    (".kv_norm.", ".norm."),
    (".kv_proj.", ".wkv."),
    (".gate_proj.", ".wgate."),
    (".position_bias", ".ape"),
    (".q_a_proj.", ".wq_a."),
    (".q_b_proj.", ".wq_b."),
    (".o_a_proj.", ".wo_a."),
    (".o_b_proj.", ".wo_b."),
    (".q_a_norm.", ".q_norm."),
    (".sinks", ".attn_sink"),
    (".input_layernorm.", ".attn_norm."),
    (".post_attention_layernorm.", ".ffn_norm."),
    (".attn_hc.", ".hc_attn_"),
    (".ffn_hc.", ".hc_ffn_"),
    (".mlp.gate.e_score_correction_bias", ".ffn.gate.bias"),
    (".shared_experts.wgate.", ".shared_experts.w1."),
    (".shared_experts.down_proj.", ".shared_experts.w2."),
    (".shared_experts.up_proj.", ".shared_experts.w3."),
    (".mlp.", ".ffn."),
]


def to_deepseek_name(name: str) -> str:
    """A model tensor's name as DeepSeek's checkpoints spell it (weights maps it back)."""
    if name == "lm_head.weight":
        return "head.weight"
    name = name.removeprefix("model.").replace("mtp.0.block.", "mtp.0.")
    name = {"embed_tokens.weight": "embed.weight"}.get(name, name)
    name = name.replace("hc_head.hc_", "hc_head_")
    for ours, theirs in _TO_DEEPSEEK:
        name = name.replace(ours, theirs)
    return name


def write_packed_checkpoint(
    path: Path, hf_config: dict, seed: int = 0, max_shard_bytes: int = 64 << 20
) -> int:
    """Write the checkpoint of `hf_config` (a config.json's dict) into directory `path`;
    returns the bytes of its tensors on disk (the safetensors files)."""
    path.mkdir(parents=True, exist_ok=True)
    config = DeepseekV4Config.from_hf_config(hf_config)
    with torch.device("meta"), skipped_init():
        skeleton = DeepseekV4ForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    writer = _ShardWriter(path, max_shard_bytes)
    linears = {
        f"{n}.weight"
        for n, m in skeleton.named_modules()
        if isinstance(m, nn.Linear) and n.startswith(("model.layers.", "mtp."))
    }
    experts = {n for n, m in skeleton.named_modules() if isinstance(m, Experts)}
    for name, tensor in skeleton.state_dict().items():
        owner, _, leaf = name.rpartition(".")
        if owner in experts:
            if leaf == "gate_up_proj":  # one pass writes all three projections
                _write_experts(writer, to_deepseek_name(owner), tensor.shape, generator)
            continue
        deepseek = to_deepseek_name(name)
        if name in linears:
            weight, scale = _fp8(tensor.shape, generator)
            writer.add(deepseek, weight)
            writer.add(deepseek.removesuffix(".weight") + ".scale", scale)
        else:
            writer.add(deepseek, _plain(name, tensor.shape, config, generator))
    writer.flush()
    (path / "config.json").write_text(json.dumps(hf_config, indent=2))
    return writer.total_bytes


def _write_experts(writer, prefix: str, gate_up_shape, generator) -> None:
    num_experts, two_i, d = gate_up_shape
    i = two_i // 2
    for expert in range(num_experts):
        for which, (out_features, in_features) in (("w1", (i, d)), ("w2", (d, i)), ("w3", (i, d))):
            name = f"{prefix}.{expert}.{which}"
            packed, scale = _fp4(out_features, in_features, generator)
            writer.add(f"{name}.weight", packed)
            writer.add(f"{name}.scale", scale)


def _fp4(out_features: int, in_features: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random e2m1 codes (uniform: |value| ~2.9 rms) and e8m0 scales near 0.5/√in / 2.9."""
    shape = (out_features, in_features // 2)
    packed = torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)
    target = round(math.log2(0.5 / math.sqrt(in_features) / 2.9)) + 127
    grid = (out_features, in_features // FP4_GROUP)
    scale = torch.randint(target - 1, target + 2, grid, generator=generator, dtype=torch.uint8)
    return packed, scale


def _fp8(shape, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """randn in e4m3, block scales around 0.5/√in."""
    out_features, in_features = shape
    weight = torch.randn(shape, generator=generator).to(torch.float8_e4m3fn)
    grid = fp8_scale_grid(out_features, in_features, FP8_BLOCK)
    scale = (0.5 + torch.rand(grid, generator=generator)) * 0.5 / math.sqrt(in_features)
    return weight, scale


def _plain(name: str, shape, config: DeepseekV4Config, generator) -> torch.Tensor:
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "tid2eid":  # each token: top_k distinct experts
        scores = torch.rand((shape[0], config.num_experts), generator=generator)
        return scores.argsort(dim=-1)[:, : shape[1]].contiguous()
    if name.endswith("norm.weight"):
        value = torch.ones(shape)
    elif leaf in ("scale", "hc_scale"):
        value = 1.0 + 0.1 * torch.randn(shape, generator=generator)
    elif leaf in ("base", "hc_base", "e_score_correction_bias"):
        value = 0.1 * torch.randn(shape, generator=generator)
    elif leaf in ("sinks", "position_bias"):
        value = 0.5 * torch.randn(shape, generator=generator)
    else:
        value = torch.randn(shape, generator=generator) * 0.5 / shape[-1] ** 0.5
    return value.to(torch.bfloat16)


class _ShardWriter:
    """Collects tensors and writes a shard once it holds max_bytes; names the shards
    model-0000i-of-0000n.safetensors at the end, as DeepSeek's are."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path, self.max_bytes = path, max_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.files: list[Path] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self.pending[name] = tensor.contiguous()
        self.pending_bytes += tensor.numel() * tensor.element_size()
        if self.pending_bytes >= self.max_bytes:
            self._write()

    def _write(self) -> None:
        if not self.pending:
            return
        file = self.path / f".shard-{len(self.files)}.safetensors.partial"
        save_file(self.pending, str(file))
        self.files.append(file)
        self.total_bytes += self.pending_bytes
        self.pending, self.pending_bytes = {}, 0

    def flush(self) -> None:
        self._write()
        for i, file in enumerate(self.files):
            file.rename(self.path / f"model-{i + 1:05d}-of-{len(self.files):05d}.safetensors")
