"""A model with packed modules as the state dict of the same model holding the dequantized
values in fp32: what a reference (transformers' DeepseekV4ForCausalLM) loads to be compared with
it. For tests and small models: it materializes every weight in fp32."""

from __future__ import annotations

import torch
from torch import nn

from inference.engine.models.packed.experts import Fp4Experts
from inference.engine.models.packed.linear import Fp8Linear


@torch.no_grad()
def dequantized_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Names as the dense model's: an Fp8Linear's `<name>.weight`, an Fp4Experts'
    `<name>.gate_up_proj` and `<name>.down_proj`; other tensors as held, floats in fp32."""
    out: dict[str, torch.Tensor] = {}
    packed = {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, Fp8Linear | Fp4Experts)
    }
    for name, module in packed.items():
        if isinstance(module, Fp8Linear):
            out[f"{name}.weight"] = module.dequantized()
        else:
            out[f"{name}.gate_up_proj"], out[f"{name}.down_proj"] = module.dequantized()
    for name, tensor in model.state_dict().items():
        if name.rpartition(".")[0] in packed:
            continue
        out[name] = tensor.float() if tensor.is_floating_point() else tensor
    return out
