"""mHC on the CPU (compiled loops, deepseek_v4.hyper_connections_cpu) against its tensor-op
form (what runs elsewhere), at decode and prefill sizes: the Sinkhorn, the gates around it, and
the streams collapsed and mixed."""

import pytest
import torch
import torch.nn.functional as F

from inference.engine.models.deepseek_v4.config import DeepseekV4Config
from inference.engine.models.deepseek_v4.hyper_connections import (
    HyperConnection,
    mix_compiled,
    mix_tensor_ops,
    runs_compiled,
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


@pytest.mark.parametrize("num_tokens", [1, 8, 300])
def test_the_compiled_collapse_and_mix_equal_their_definition(num_tokens):
    """A block's input collapsed from the streams (Σ_j pre_j · stream_j) and its output mixed
    back (post_k · out + Σ_j comb[j, k] · stream_j): the CPU's compiled loops and the tensor
    ops other devices run, against the sums written out."""
    config = DeepseekV4Config.from_hf_config(dict(TINY_CONFIG, vocab_size=64))
    hyper = HyperConnection(config)
    generator = torch.Generator().manual_seed(num_tokens)
    n, hidden = config.hc_mult, config.hidden_size
    with torch.no_grad():
        hyper.fn.copy_(torch.randn(hyper.fn.shape, generator=generator) * 0.05)
    streams = torch.randn(num_tokens, n, hidden, generator=generator)
    out = torch.randn(num_tokens, hidden, generator=generator)
    post = torch.rand(num_tokens, n, generator=generator)
    comb = torch.rand(num_tokens, n, n, generator=generator)
    want_mix = post[..., None] * out[:, None, :] + torch.einsum("tjk,tjd->tkd", comb, streams)
    with torch.inference_mode():
        assert runs_compiled(streams)
        torch.testing.assert_close(mix_compiled(post, comb, out, streams), want_mix)
        torch.testing.assert_close(mix_tensor_ops(post, comb, out, streams), want_mix)
        pre, _, _ = hyper.gates(
            F.linear(F.rms_norm(streams.flatten(1), (n * hidden,), eps=hyper.norm_eps), hyper.fn)
        )
        _, _, collapsed = hyper(streams)
    torch.testing.assert_close(collapsed, torch.einsum("tj,tjd->td", pre, streams))
    with torch.enable_grad():  # a gradient asked for: the tensor ops, not the loops
        assert not runs_compiled(streams)


def test_another_stream_count_runs_the_tensor_ops():
    """The compiled loops are written for four streams; two run the tensor ops and give the
    same gates as the definition, and the Sinkhorn loop refuses matrices not 4 × 4."""
    config = DeepseekV4Config.from_hf_config(dict(TINY_CONFIG, vocab_size=64, hc_mult=2))
    hyper = HyperConnection(config)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        hyper.fn.copy_(torch.randn(hyper.fn.shape, generator=generator) * 0.05)
    streams = torch.randn(5, 2, config.hidden_size, generator=generator)
    with torch.inference_mode():
        assert not runs_compiled(streams)
        post, comb, collapsed = hyper(streams)
        mixes = F.linear(
            F.rms_norm(streams.flatten(1), (2 * config.hidden_size,), eps=1e-6), hyper.fn
        )
        pre, want_post, want_comb = hyper.gates(mixes)
    torch.testing.assert_close(post, want_post)
    torch.testing.assert_close(comb, want_comb)
    torch.testing.assert_close(collapsed, torch.einsum("tj,tjd->td", pre, streams))
    with pytest.raises(ValueError, match="4 x 4"):
        sinkhorn_in_place(torch.rand(3, 3, 3).numpy(), 20, 1e-6)
