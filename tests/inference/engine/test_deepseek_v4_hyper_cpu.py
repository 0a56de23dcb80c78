"""mHC on the CPU (compiled loops, deepseek_v4.hyper_connections_cpu) against its tensor-op
form (what runs elsewhere), at decode and prefill sizes: the Sinkhorn, and the gates around it."""

import pytest
import torch

from inference.engine.models.deepseek_v4.config import DeepseekV4Config
from inference.engine.models.deepseek_v4.hyper_connections import (
    HyperConnection,
    sinkhorn,
)
from inference.engine.models.deepseek_v4.hyper_connections_cpu import sinkhorn_in_place
from inference.engine.models.deepseek_v4.tiny import TINY_CONFIG


@pytest.mark.parametrize("num_tokens", [1, 8, 300])
def test_the_compiled_loop_equals_the_array_form(num_tokens):
    generator = torch.Generator().manual_seed(num_tokens)
    logits = torch.randn(num_tokens, 4, 4, generator=generator) * 3
    comb = torch.softmax(logits, dim=-1) + 1e-6
    got = comb.clone()
    sinkhorn_in_place(got.numpy(), 20, 1e-6)
    want = sinkhorn(comb, 20, 1e-6)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert not torch.equal(got, comb)  # it normalized
    assert not torch.equal(want, comb)  # the array form too, into a copy (T == 1 included)
    torch.testing.assert_close(got.sum(dim=-2), torch.ones(num_tokens, 4), rtol=0, atol=1e-5)


@pytest.mark.parametrize("num_tokens", [1, 8, 300])
def test_the_compiled_gates_equal_the_tensor_ops(num_tokens):
    """HyperConnection's pre, post and comb from its mixes: the CPU's compiled loop against the
    tensor ops other devices run."""
    config = DeepseekV4Config.from_hf_config(dict(TINY_CONFIG, vocab_size=64))
    hyper = HyperConnection(config)
    generator = torch.Generator().manual_seed(num_tokens)
    with torch.no_grad():
        hyper.base.copy_(torch.randn(hyper.base.shape, generator=generator))
        hyper.scale.copy_(torch.rand(3, generator=generator) + 0.5)
    mixes = torch.randn(num_tokens, hyper.base.numel(), generator=generator) * 2
    with torch.inference_mode():
        for got, want in zip(hyper._gates_compiled(mixes), hyper.gates(mixes), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
