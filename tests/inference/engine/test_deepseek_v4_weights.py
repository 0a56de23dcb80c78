"""Loading DeepSeek-V4 in DeepSeek's own checkpoint layout: its tensor names, FP8 linears with a
scale per 128 x 128 block, FP4 experts (two e2m1 per byte) with an e8m0 scale per 32 inputs,
per-expert matrices, and shards. The quantized values are built exactly representable, so the
dequantized weights must come back exactly; FP8/FP4 are held packed (models/packed)."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch
from safetensors.torch import save_file

from inference.engine.models import load_model
from inference.engine.models.deepseek_v4.packed_checkpoint import to_deepseek_name
from inference.engine.models.deepseek_v4.tiny import NAME, tiny_checkpoint
from inference.engine.models.packed.dequantized import dequantized_state_dict
from inference.engine.models.packed.experts import Fp4Experts
from inference.engine.models.packed.formats import dequantize_fp4, dequantize_fp8, unpack_fp4
from inference.engine.models.packed.linear import Fp8Linear


def deepseek_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's tensors as DeepSeek's checkpoint names and splits them (experts one by one)."""
    out = {}
    for name, tensor in state.items():
        if name.endswith(".experts.gate_up_proj"):
            prefix, half = (
                to_deepseek_name(name.removesuffix(".gate_up_proj")),
                tensor.shape[1] // 2,
            )
            for i, matrix in enumerate(tensor):
                out[f"{prefix}.{i}.w1.weight"] = matrix[:half]
                out[f"{prefix}.{i}.w3.weight"] = matrix[half:]
        elif name.endswith(".experts.down_proj"):
            for i, matrix in enumerate(tensor):
                out[f"{to_deepseek_name(name.removesuffix('.down_proj'))}.{i}.w2.weight"] = matrix
        else:
            out[to_deepseek_name(name)] = tensor
    return out


def write_checkpoint(path, tensors: dict[str, torch.Tensor], num_shards: int = 2) -> None:
    """`tensors` in `num_shards` safetensors files, beside the tiny model's config and tokenizer."""
    source = tiny_checkpoint(0)
    for file in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / file, path / file)
    names = sorted(tensors)
    for i in range(num_shards):
        part = names[i * len(names) // num_shards : (i + 1) * len(names) // num_shards]
        save_file(
            {n: tensors[n].contiguous() for n in part},
            str(path / f"model-0000{i + 1}-of-0000{num_shards}.safetensors"),
        )


def _ours(deepseek_name: str) -> str:
    """The model's prefix for a DeepSeek name's layer (a main layer or the MTP layer's block)."""
    if deepseek_name.startswith("mtp.0."):
        return "mtp.0.block." + deepseek_name.removeprefix("mtp.0.")
    return "model." + deepseek_name


@pytest.fixture(scope="module")
def state():
    return load_model(NAME, torch.device("cpu")).model.state_dict()


def test_deepseek_names_map_back_to_ours(state, tmp_path):
    checkpoint = deepseek_names(state)
    assert "layers.1.attn.indexer.compressor.ape" in checkpoint
    assert "layers.2.ffn.experts.7.w3.weight" in checkpoint and "hc_head_fn" in checkpoint
    # The MTP layer as DeepSeek's inference code names it (its block's tensors like a layer's).
    assert "mtp.0.attn.wq_a.weight" in checkpoint and "mtp.0.hc_head_fn" in checkpoint
    assert "mtp.0.ffn.experts.7.w2.weight" in checkpoint and "mtp.0.norm.weight" in checkpoint
    assert "mtp.0.hc_attn_fn" in checkpoint and "mtp.0.e_proj.weight" in checkpoint
    write_checkpoint(tmp_path, checkpoint)
    loaded = load_model(str(tmp_path), torch.device("cpu")).model.state_dict()
    assert sorted(loaded) == sorted(state)
    for name, tensor in state.items():
        assert torch.equal(loaded[name], tensor), name


def test_fp8_blocks_and_fp4_experts_dequantize_exactly():
    rng = torch.Generator().manual_seed(0)
    # FP8: a 256 x 384 weight, 2 x 3 blocks of 128 x 128, each with its own scale (formats.py)
    scales = torch.rand(2, 3, generator=rng) + 0.5
    fp8 = (torch.randn(256, 384, generator=rng) * 100).to(torch.float8_e4m3fn)
    expected = fp8.float() * scales.repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert torch.equal(dequantize_fp8(fp8, scales), expected)
    # FP4: 4 x 64 values as 4 x 32 bytes, low nibble first; e8m0 scales per 32 inputs
    codes = torch.randint(0, 16, (4, 64), generator=rng)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    table = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    values = torch.tensor([[table[c] for c in row] for row in codes.tolist()])
    assert torch.equal(unpack_fp4(packed), values)
    exponents = torch.randint(120, 134, (4, 2), generator=rng).to(torch.uint8)
    powers = (exponents.float() - 127).exp2().repeat_interleave(32, 1)
    assert torch.equal(dequantize_fp4(packed, exponents), values * powers)


def test_a_quantized_sharded_checkpoint_loads_as_the_model_it_encodes(state, tmp_path):
    """The tiny model's attention projections in FP8 and its experts in FP4 (values chosen
    representable), DeepSeek's names, two shards: the engine loads exactly those values."""
    rng = random.Random(0)
    checkpoint = deepseek_names(state)
    expected = dict(state)
    for name in [n for n in checkpoint if n.endswith((".wq_a.weight", ".wo_b.weight"))]:
        weight = checkpoint[name]
        scale = torch.full((1, 1), 2.0 ** rng.randint(-8, -4))
        quantized = (weight / scale).to(torch.float8_e4m3fn)
        checkpoint[name] = quantized
        checkpoint[name.replace(".weight", ".scale")] = scale
        ours = _ours(name).replace(".attn.", ".self_attn.").replace(".wq_a.", ".q_a_proj.")
        ours = ours.replace(".wo_b.", ".o_b_proj.")
        expected[ours] = quantized.float() * scale
    table = torch.tensor(
        [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    )
    for name in [n for n in checkpoint if ".experts." in n]:
        rows, cols = checkpoint[name].shape
        codes = torch.randint(
            0, 16, (rows, cols), generator=torch.Generator().manual_seed(len(name))
        )
        exponents = torch.full((rows, cols // 32), 127 - 6, dtype=torch.uint8)
        checkpoint[name] = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
        checkpoint[name.replace(".weight", ".scale")] = exponents
        value = table[codes] * 2.0**-6
        index, which = int(name.split(".")[4]), name.split(".")[5]
        prefix = _ours(name.split(".experts.")[0]).replace(".ffn", ".mlp") + ".experts."
        half = state[prefix + "gate_up_proj"].shape[1] // 2
        if which == "w1":
            expected[prefix + "gate_up_proj"] = expected[prefix + "gate_up_proj"].clone()
            expected[prefix + "gate_up_proj"][index, :half] = value
        elif which == "w3":
            expected[prefix + "gate_up_proj"] = expected[prefix + "gate_up_proj"].clone()
            expected[prefix + "gate_up_proj"][index, half:] = value
        else:
            expected[prefix + "down_proj"] = expected[prefix + "down_proj"].clone()
            expected[prefix + "down_proj"][index] = value
    write_checkpoint(tmp_path, checkpoint)
    loaded = load_model(str(tmp_path), torch.device("cpu"))
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "deepseek_v4"
    assert isinstance(loaded.model.model.layers[0].self_attn.q_a_proj, Fp8Linear)
    assert isinstance(loaded.model.model.layers[0].mlp.experts, Fp4Experts)
    held = dequantized_state_dict(loaded.model)
    assert sorted(held) == sorted(expected)
    for name, tensor in held.items():
        assert torch.equal(tensor, expected[name]), name


def test_a_model_with_no_sliding_only_layer_still_keeps_its_windows(tmp_path):
    """transformers' default schedule (HCA, HCA, then CSA/HCA) has no sliding-only layer, yet
    every V4 layer keeps a window: the engine still gets its sliding group, and a prefix hit
    resumes exactly."""
    import random

    from inference.engine import EngineConfig, LLMEngine, SamplingParams
    from inference.engine.models.deepseek_v4 import DeepseekV4Config, DeepseekV4ForCausalLM
    from inference.engine.models.deepseek_v4.tiny import TINY_CONFIG, _init_random

    source = tiny_checkpoint(0)
    hf = json.loads((source / "config.json").read_text())
    hf["layer_types"] = ["heavily_compressed_attention"] * 2 + [
        "compressed_sparse_attention",
        "heavily_compressed_attention",
    ]
    hf["num_hidden_layers"], hf["mlp_layer_types"] = 4, TINY_CONFIG["mlp_layer_types"][:4]
    model = DeepseekV4ForCausalLM(DeepseekV4Config.from_hf_config(hf))
    _init_random(model, 1)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(tmp_path / "model.safetensors"),
    )
    (tmp_path / "config.json").write_text(json.dumps(hf))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / file, tmp_path / file)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    rng = random.Random(0)
    head = [rng.randrange(1000, 49_000) for _ in range(200)]
    first, second = [*head, 1001, 1002], [*head, 2001, 2002]
    cached = LLMEngine(EngineConfig(model=str(tmp_path), num_kv_blocks=64))
    cold = LLMEngine(
        EngineConfig(model=str(tmp_path), num_kv_blocks=64, enable_prefix_caching=False)
    )
    try:
        assert cached.kv_cache_manager.sliding is not None
        cached.generate(first, params)
        hit = cached.generate(second, params)[0]
        assert hit.metrics.num_cached_tokens == 200
        assert hit.token_ids == cold.generate(second, params)[0].token_ids
    finally:
        cached.shutdown()
        cold.shutdown()
