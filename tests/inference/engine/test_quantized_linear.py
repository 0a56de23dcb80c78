"""Weight-only quantized linear layers (models/quantized_linear.py) and EngineConfig(weights=)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from benchmarks.weights_agreement import forced_logits
from inference.engine import EngineConfig, SamplingParams
from inference.engine.models.quantized_linear import (
    MAX_KERNEL_ROWS,
    QuantizedLinear,
    quantize_int4,
    quantize_int8,
)


def _weight(out_features: int = 96, in_features: int = 128) -> torch.Tensor:
    return torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 4, MAX_KERNEL_ROWS + 1])
def test_quantized_linear_matches_fp32_matmul_of_its_dequantized_weight(fmt, rows):
    weight = _weight()
    layer = QuantizedLinear(weight, fmt)
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(1))
    expected = F.linear(x, layer.dequantized())
    out = layer(x)
    assert out.dtype == torch.float32 and out.shape == (rows, 96)
    # Kernel rows go in as bf16 (8 bits of mantissa): ~1% of the output's scale.
    tolerance = 0.02 * float(expected.abs().max())
    assert float((out - expected).abs().max()) < tolerance
    # And the dequantized weight is the original within its quantization step.
    step = 1 / 127 if fmt == "int8" else 1 / 15
    span = weight.abs().amax(dim=1, keepdim=True) * (1 if fmt == "int8" else 2)
    assert bool(((layer.dequantized() - weight).abs() <= span * step / 2 + 1e-6).all())


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("tile_values", [7 * 128, 1])  # 7 rows, the last tile partial; 1 row
def test_prefill_tiles_cover_every_row_and_equal_the_dequantized_matmul(
    monkeypatch, fmt, tile_values
):
    """Prefill rows multiply the weight a tile of rows at a time (tiled_linear.py): tiles of 7
    rows (96 = 13 x 7 + 5) or of one row give F.linear's output on the dequantized weight, for
    a (batch, tokens, in) input too; the tiles hold exactly dequantized()'s values."""
    from inference.engine.models import quantized_linear

    monkeypatch.setattr(quantized_linear, "PREFILL_TILE_VALUES", tile_values)
    layer = QuantizedLinear(_weight(), fmt)
    x = torch.randn(2, MAX_KERNEL_ROWS, 128, generator=torch.Generator().manual_seed(1))
    out = layer(x)
    assert out.dtype == torch.float32 and out.shape == (2, MAX_KERNEL_ROWS, 96)
    torch.testing.assert_close(out, F.linear(x, layer.dequantized()), rtol=1e-5, atol=1e-5)
    # The values each tile is filled with: (code [- 8]) * scale + zero, the group's.
    codes = layer.codes.float() - (8 if fmt == "int4" else 0)
    per_value = layer.group_size if fmt == "int4" else 128
    scales = layer.scales.view(96, -1).repeat_interleave(per_value, dim=1)
    zeros = layer.zeros.view(96, -1).repeat_interleave(per_value, dim=1)
    assert torch.equal(layer.dequantized(), codes * scales + zeros)


def test_int8_codes_are_symmetric_per_row_and_int4_codes_are_nibbles_per_group():
    weight = _weight()
    codes, scales = quantize_int8(weight)
    assert codes.dtype == torch.int8 and scales.shape == (96,)
    assert int(codes.abs().max()) == 127  # each row's largest weight takes the full range
    codes4, scales4, zeros4 = quantize_int4(weight, 32)
    assert scales4.shape == zeros4.shape == (96, 4)
    assert int(codes4.min()) >= 0 and int(codes4.max()) == 15


def test_int4_rejects_shapes_its_kernel_cannot_tile():
    with pytest.raises(ValueError, match="divisible by 32"):
        QuantizedLinear(_weight(96, 100), "int4")


def test_bad_weights_value_is_a_clear_error():
    with pytest.raises(ValueError, match="weights must be one of"):
        EngineConfig(weights="int2")
    with pytest.raises(ValueError, match="CPU kernels only"):
        EngineConfig(device="cuda", weights="int8")


def test_architecture_without_quantized_layers_says_so():
    from inference.engine.models import resolve_weights

    with pytest.raises(ValueError, match="supports the architectures"):
        resolve_weights("int4", "deepseek_v4", torch.device("cpu"))
    assert resolve_weights("auto", "deepseek_v4", torch.device("cpu")) == "fp32"
    assert resolve_weights("auto", "llama", torch.device("cuda")) == "fp32"


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("model", ["smollm2-tiny-random", "gemma3-tiny-random"])
def test_quantized_engine_follows_fp32(make_tiny_engine, model, fmt):
    params = SamplingParams(max_tokens=8, temperature=0.0)
    prompts = ["The harbor at dawn", "Where does Aoi go for lunch?", "One, two, three"]
    reference_engine = make_tiny_engine(model=model)
    reference = reference_engine.generate(prompts, params)
    engine = make_tiny_engine(model=model, weights=fmt)
    outputs = engine.generate(prompts, params)
    assert all(o.metrics.weights == fmt for o in outputs)
    assert engine.stats().weights == fmt
    projections = _projections(engine.runner.model)
    assert all(isinstance(m, QuantizedLinear) and m.fmt == fmt for m in projections)
    assert engine.runner.model.lm_head.fmt == "int8"  # the head keeps 8 bits, as the file does
    # Different kernels: not bit-identical. A random tiny model's logits are nearly flat over
    # 49k tokens, so its greedy choices flip at int4's error; int8 keeps the first ones.
    if fmt == "int8":
        agreed = [r.token_ids[0] == o.token_ids[0] for r, o in zip(reference, outputs, strict=True)]
        assert sum(agreed) >= 2, agreed
    # Teacher-forced on the fp32 output, the logits point the same way.
    for r in reference:
        prompt, output = list(r.prompt_token_ids), list(r.token_ids)
        expected = forced_logits(reference_engine, prompt, output)
        got = forced_logits(engine, prompt, output)
        cosine = F.cosine_similarity(expected, got, dim=-1)
        assert float(cosine.min()) > (0.99 if fmt == "int8" else 0.9), cosine


def _projections(model):
    layer = model.layers[0]
    return [layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.down_proj]
