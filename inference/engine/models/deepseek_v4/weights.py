"""A DeepSeek-V4 checkpoint's own tensors → the names and dtypes DeepseekV4ForCausalLM loads.

DeepSeek ships V4 under its own names (`layers.0.attn.wq_a.weight`, `layers.3.ffn.experts.17.w1
.weight`, `embed.weight`, `hc_head_fn`, ...), its linear weights in FP8 (e4m3) with a scale per
128 x 128 block and its routed experts in FP4 (e2m1, two per byte) with a scale per 32 inputs.
Here, on CPU at load: each quantized weight is multiplied out by its scale grid, the names are
mapped as transformers' conversion mapping for `deepseek_v4` maps them, and the per-expert
matrices are stacked into the (experts, ...) tensors the model holds. A checkpoint already in
transformers' names (ours, or one saved by transformers) passes through unchanged.
"""

from __future__ import annotations

import re

import torch

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
_FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_SCALE_SUFFIXES = (".weight_scale_inv", ".scale")


def is_quantized(tensor: torch.Tensor) -> bool:
    """FP8 (1-byte float) or packed FP4 (int8 / uint8 / float4_e2m1fn_x2) weights."""
    return (
        tensor.dtype in (torch.int8, torch.uint8)
        or (tensor.is_floating_point() and tensor.element_size() == 1)
        or str(tensor.dtype) == "torch.float4_e2m1fn_x2"
    )


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Two e2m1 values per byte, low nibble first → fp32, the last dim twice as wide."""
    table = torch.tensor(_FP4_E2M1, dtype=torch.float32)
    u8 = packed.contiguous().view(torch.uint8)
    pairs = torch.stack([table[(u8 & 0xF).long()], table[(u8 >> 4).long()]], dim=-1)
    return pairs.reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def dequantize(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 weight = quantized value x its block's scale; the block shape is the weight's
    shape over the scale grid's (128 x 128 for FP8 linears, 1 x 32 for FP4 experts)."""
    packed = not weight.is_floating_point() or str(weight.dtype) == "torch.float4_e2m1fn_x2"
    values = unpack_fp4(weight) if packed else weight.float()
    if scale.dtype == torch.uint8:  # e8m0 exponents stored as bytes
        scale = (scale.float() - 127.0).exp2()
    scale = scale.float()
    if scale.numel() == 1:  # one scale for the whole tensor
        return values * scale.reshape(())
    rows, cols = values.shape[-2:]
    grid_rows, grid_cols = scale.shape[-2:]
    if rows % grid_rows or cols % grid_cols:
        raise ValueError(
            f"weight of shape {tuple(values.shape)} does not divide into its scale grid "
            f"{tuple(scale.shape)}"
        )
    blocks = values.reshape(-1, grid_rows, rows // grid_rows, grid_cols, cols // grid_cols)
    return (blocks * scale.reshape(-1, grid_rows, 1, grid_cols, 1)).reshape(values.shape)


def to_model_names(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under DeepseekV4ForCausalLM's names, dequantized to fp32."""
    if any(name.startswith("model.") for name in weights):
        return weights  # transformers' names already
    weights = _dequantized(weights)
    renamed: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for name, tensor in weights.items():
        if name.startswith("mtp."):
            name = _mtp_name(name)
            if name.startswith("mtp."):  # the MTP layer's own tensors
                renamed[name] = tensor
                continue
        for pattern, replacement in _RENAMES:
            name = re.sub(pattern, replacement, name)
        if not name.startswith("lm_head."):
            name = f"model.{name}"
        match = _EXPERT.match(name)
        if match:
            per_kind = experts.setdefault(match["prefix"], {})
            per_kind.setdefault(match["which"], {})[int(match["index"])] = tensor
            continue
        renamed[name] = tensor
    for prefix, kinds in experts.items():
        count = len(kinds.get("w2", {}))

        def stacked(
            kind: str, prefix: str = prefix, kinds=kinds, count: int = count
        ) -> torch.Tensor:
            if sorted(kinds.get(kind, {})) != list(range(count)):
                raise ValueError(
                    f"{prefix}: experts' {kind} tensors are not numbered 0..{count - 1}"
                )
            return torch.stack([kinds[kind][i] for i in range(count)])

        # gate_up = [w1; w3] per expert (gate rows first), down = w2
        renamed[f"{prefix}.gate_up_proj"] = torch.cat([stacked("w1"), stacked("w3")], dim=1)
        renamed[f"{prefix}.down_proj"] = stacked("w2")
    block = f"model.layers.{_MTP_BLOCK}."
    return {
        (f"mtp.0.block.{name[len(block) :]}" if name.startswith(block) else name): tensor
        for name, tensor in renamed.items()
    }


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


def _dequantized(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    scales = set()
    for name, tensor in weights.items():
        if not (name.endswith(".weight") and is_quantized(tensor)):
            continue
        base = name[: -len(".weight")]
        scale_name = next((base + s for s in _SCALE_SUFFIXES if base + s in weights), None)
        if scale_name is None:
            raise ValueError(
                f"{name} is quantized ({tensor.dtype}) but the checkpoint has no scale for it"
            )
        out[name] = dequantize(tensor, weights[scale_name])
        scales.add(scale_name)
    for name, tensor in weights.items():
        if name not in out and name not in scales:
            out[name] = tensor.float() if tensor.is_floating_point() else tensor
    return out
