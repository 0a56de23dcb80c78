"""mHC's Sinkhorn on the CPU (one compiled loop, deepseek_v4.sinkhorn_cpu) against its
whole-array form (what runs elsewhere), at decode and prefill sizes."""

import pytest
import torch

from inference.engine.models.deepseek_v4.hyper_connections import sinkhorn, sinkhorn_arrays


@pytest.mark.parametrize("num_tokens", [1, 8, 300])
def test_the_compiled_loop_equals_the_array_form(num_tokens):
    generator = torch.Generator().manual_seed(num_tokens)
    logits = torch.randn(num_tokens, 4, 4, generator=generator) * 3
    comb = torch.softmax(logits, dim=-1) + 1e-6
    got = sinkhorn(comb, 20, 1e-6)
    torch.testing.assert_close(got, sinkhorn_arrays(comb, 20, 1e-6), rtol=1e-6, atol=1e-7)
    assert not torch.equal(got, comb)  # it normalized, and not the input in place
    torch.testing.assert_close(got.sum(dim=-2), torch.ones(num_tokens, 4), rtol=0, atol=1e-5)
