"""DeepSeek-V4's RMS norms on the CPU (one compiled loop, deepseek_v4.norms_cpu) against torch's
rms_norm, and when the model's norms run it."""

import pytest
import torch
import torch.nn.functional as F

from inference.engine.models.deepseek_v4 import layers
from inference.engine.models.deepseek_v4.layers import RMSNorm, unweighted_rms_norm
from inference.engine.models.deepseek_v4.norms_cpu import compiled_rms_norm, runs_compiled


@pytest.mark.parametrize("shape", [(1, 8), (7, 128), (300, 512), (5, 4, 64), (0, 64)])
@pytest.mark.parametrize("weighted", [True, False])
def test_the_loop_equals_torchs_rms_norm(shape, weighted):
    generator = torch.Generator().manual_seed(shape[-1] + shape[0])
    x = torch.randn(shape, generator=generator) * 3
    weight = torch.rand(shape[-1], generator=generator) + 0.5 if weighted else None
    got = compiled_rms_norm(x, weight, 1e-6)
    want = F.rms_norm(x, (shape[-1],), weight, 1e-6)
    assert got.shape == x.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_loop_reads_a_strided_input_and_leaves_it_as_it_was():
    generator = torch.Generator().manual_seed(0)
    streams = torch.randn(6, 4, 32, generator=generator)
    x = streams.transpose(0, 1)  # (4, 6, 32), not contiguous
    before = x.clone()
    torch.testing.assert_close(
        compiled_rms_norm(x, None, 1e-6), F.rms_norm(x, (32,), eps=1e-6), rtol=1e-5, atol=1e-6
    )
    assert torch.equal(x, before)


def test_the_model_norms_run_the_loop_only_for_fp32_cpu_inference(monkeypatch):
    calls = []

    def counting(x, weight, eps):
        calls.append(weight is None)
        return compiled_rms_norm(x, weight, eps)

    monkeypatch.setattr(layers, "compiled_rms_norm", counting)
    norm = RMSNorm(16, 1e-6)
    x = torch.randn(3, 16)
    with torch.inference_mode():
        norm(x), unweighted_rms_norm(x, 1e-6)
    assert calls == [False, True]
    norm(x)  # gradients on: torch's op, which autograd follows
    with torch.inference_mode():
        out = norm(x.bfloat16())  # another dtype: torch's op, the dtype kept
    assert calls == [False, True] and out.dtype == torch.bfloat16
    assert not runs_compiled(x, None)  # gradients on
    with torch.no_grad():
        assert runs_compiled(x, None) and not runs_compiled(x, torch.ones(16).bfloat16())
