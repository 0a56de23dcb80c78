"""A DeepSeek-V4 checkpoint's tensor names → the names DeepseekV4ForCausalLM holds them under.

Three layouts are in use, and one checkpoint is read name by name, each name tried as:
- the model's (transformers') own names: `model.layers.0.self_attn.q_a_proj.weight`, the
  experts stacked as `model.layers.0.mlp.experts.gate_up_proj` (ours, transformers' in memory);
- DeepSeek's: `layers.0.attn.wq_a.weight`, `layers.3.ffn.experts.17.w1.weight`, `embed.weight`,
  `head.weight`, `hc_head_fn`, `mtp.0.*`, mapped as transformers' conversion mapping for
  `deepseek_v4` maps them;
- what transformers' `save_pretrained` writes (5.25: its conversion reversed, under a `model.`
  prefix, with some names its reversal leaves as they are): `model.layers.0.attn.wq_a.weight`,
  `model.layers.0.ffn.experts.0.w1.weight`, `model.embed_tokens.weight`, `model.hc_head.hc_fn`,
  `head.weight` — DeepSeek's names after the prefix.
A name is taken under the first reading that gives a name the model has; the layout is thus
recognized by what the names map to, never by one prefix.

Per-expert matrices (`…experts.<i>.w1/w3/w2.weight`) map to the experts module and an
(expert, projection) pair; the loader (deepseek_v4.loader) places them. The quantized formats
themselves are packed/formats.py's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# transformers' conversion_mapping["deepseek_v4"] renames, in its order.
_RENAMES = [
    (r"\.attn\.", ".self_attn."),
    (r"\.ffn\.", ".mlp."),
    (r"\.indexer\.compressor\.", ".compressor.indexer."),
    (r"^embed\.weight", "embed_tokens.weight"),
    (r"^head\.weight", "lm_head.weight"),
    (r"^hc_head_fn", "hc_head.hc_fn"),
    (r"^hc_head_base", "hc_head.hc_base"),
    (r"^hc_head_scale", "hc_head.hc_scale"),
    (r"\.attn_norm\.", ".input_layernorm."),
    (r"\.ffn_norm\.", ".post_attention_layernorm."),
    (r"\.hc_attn_fn", ".attn_hc.fn"),
    (r"\.hc_attn_base", ".attn_hc.base"),
    (r"\.hc_attn_scale", ".attn_hc.scale"),
    (r"\.hc_ffn_fn", ".ffn_hc.fn"),
    (r"\.hc_ffn_base", ".ffn_hc.base"),
    (r"\.hc_ffn_scale", ".ffn_hc.scale"),
    (r"\.attn_sink", ".sinks"),
    (r"\.indexer\.weights_proj\.", ".compressor.indexer.scorer.weights_proj."),
    (r"\.indexer\.wq_b\.", ".compressor.indexer.q_b_proj."),
    (r"\.norm\.", ".kv_norm."),
    (r"\.ape", ".position_bias"),
    (r"\.wq_a\.", ".q_a_proj."),
    (r"\.self_attn\.wq_b\.", ".self_attn.q_b_proj."),
    (r"\.wkv\.", ".kv_proj."),
    (r"\.wgate\.", ".gate_proj."),
    (r"\.wo_a\.", ".o_a_proj."),
    (r"\.wo_b\.", ".o_b_proj."),
    (r"\.q_norm\.", ".q_a_norm."),
    (r"\.gate\.bias", ".gate.e_score_correction_bias"),
    (r"\.shared_experts\.w1\.", ".shared_experts.gate_proj."),
    (r"\.shared_experts\.w2\.", ".shared_experts.down_proj."),
    (r"\.shared_experts\.w3\.", ".shared_experts.up_proj."),
]
_EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<index>\d+)\.(?P<which>w[123])\.weight$")
SCALE_SUFFIXES = (".scale", ".weight_scale_inv")  # DeepSeek's, then transformers' FP8 name


@dataclass(frozen=True, slots=True)
class ModelName:
    """Where a checkpoint tensor goes: a tensor of the model (`name`), or one projection
    (w1 gate, w3 up, w2 down) of one routed expert of the experts module `name`."""

    name: str
    expert: int | None = None
    which: str | None = None


def model_name(
    checkpoint_name: str, tensor_names: set[str], experts_modules: set[str]
) -> ModelName | None:
    """`checkpoint_name` under the model's names (tensor_names: its tensors', experts_modules:
    its experts modules'), trying each layout in turn; None where no reading fits."""
    for candidate in _readings(checkpoint_name):
        match = _EXPERT.match(candidate)
        if match and match["prefix"] in experts_modules:
            return ModelName(match["prefix"], int(match["index"]), match["which"])
        if candidate in tensor_names:
            return ModelName(candidate)
    return None


def _readings(name: str) -> list[str]:
    readings = [name]
    for deepseek in (name, name.removeprefix("model.")):
        try:
            readings.append(deepseek_to_model_name(deepseek))
        except ValueError:  # not a DeepSeek MTP name either
            continue
    return readings


def deepseek_to_model_name(name: str) -> str:
    """A DeepSeek name → the model's (per-expert names keep their `.experts.<i>.w<k>.weight`)."""
    if name.startswith("mtp."):
        name = _mtp_name(name)
        if name.startswith("mtp."):  # the MTP layer's own tensors
            return name
    for pattern, replacement in _RENAMES:
        name = re.sub(pattern, replacement, name)
    if not name.startswith("lm_head."):
        name = f"model.{name}"
    block = f"model.layers.{_MTP_BLOCK}."
    return f"mtp.0.block.{name[len(block) :]}" if name.startswith(block) else name


# The MTP layer (deepseek_v4.mtp), as DeepSeek's `inference/model.py` MTPBlock names it:
# `mtp.0.{e_proj,h_proj}.weight`, `mtp.0.{enorm,hnorm,norm}.weight`, `mtp.0.hc_head_{fn,base,
# scale}`, and its block's tensors under the names a main layer's have (`mtp.0.attn.wq_a...`,
# `mtp.0.ffn.experts.3.w1...`, `mtp.0.hc_attn_fn`): those are renamed as a layer's, under a
# layer index no model has, then moved under `mtp.0.block.`.
_MTP_BLOCK = 1_000_000
_MTP_OWN = re.compile(r"^mtp\.0\.(e_proj|h_proj|enorm|hnorm|norm)\.")
_MTP_HC_HEAD = re.compile(r"^mtp\.0\.hc_head_(fn|base|scale)(\.weight)?$")


def _mtp_name(name: str) -> str:
    """A DeepSeek MTP tensor's name: its own (`mtp.0.…` in the model's names), or for its
    block's a main layer's DeepSeek name to rename like the others."""
    if _MTP_OWN.match(name):
        return name
    match = _MTP_HC_HEAD.match(name)
    if match:
        return f"mtp.0.hc_head.hc_{match[1]}"
    if not name.startswith("mtp.0."):
        raise ValueError(f"{name}: only one MTP layer (mtp.0) is supported")
    return f"layers.{_MTP_BLOCK}.{name[len('mtp.0.') :]}"
