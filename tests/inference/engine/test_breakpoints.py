"""Cache breakpoints: validation, positions from chat messages marked "cache", and the
runner's partial-block copy (every layer of its group, nothing else)."""

import logging

import pytest
import torch

from inference.engine import SamplingParams
from inference.engine.kv.breakpoints import chat_breakpoints
from inference.engine.kv.partial_blocks import BlockCopy


@pytest.mark.parametrize("bad", [[0], [-3], ["12"], [True], 5])
def test_a_breakpoint_must_be_a_positive_token_position(bad):
    with pytest.raises(ValueError, match="cache_breakpoints"):
        SamplingParams(cache_breakpoints=bad)


def test_a_breakpoint_past_the_prompt_is_a_value_error(tiny_engine):
    with pytest.raises(ValueError, match=r"outside the prompt: each must be in \(0, 3\]"):
        tiny_engine.generate([5, 6, 7], SamplingParams(max_tokens=1, cache_breakpoints=[4]))


def test_a_message_marked_cache_ends_a_breakpoint(tiny_engine):
    tokenizer = tiny_engine.tokenizer
    messages = [
        {"role": "system", "content": "Town rules. " * 20, "cache": True},
        {"role": "user", "content": "Shop table. " * 10, "cache": True},
        {"role": "user", "content": "You are Hana. What next?"},
    ]
    ids = tokenizer.apply_chat_template(messages)
    positions = chat_breakpoints(tokenizer, messages, ids)
    heads = [
        tokenizer.apply_chat_template(messages[:n], add_generation_prompt=False) for n in (1, 2)
    ]
    assert positions == [len(h) for h in heads]
    assert all(ids[: len(h)] == h for h in heads)
    salt = "chat-breakpoints"
    params = SamplingParams(max_tokens=1, temperature=0.0, cache_salt=salt)
    tiny_engine.generate(messages, params)
    other = [*messages[:2], {"role": "user", "content": "You are Kenji. Where to?"}]
    out = tiny_engine.generate(other, params)[0].metrics
    assert out.num_cached_tokens >= positions[-1]


def test_a_template_that_rewrites_earlier_turns_drops_the_breakpoint(caplog):
    class Rewriting:  # renders the head differently from the start of the whole conversation
        def render_chat(self, messages, add_generation_prompt=True):
            return ("<whole>" if add_generation_prompt else "<head>") + str(len(messages))

        def encode(self, text):
            return [ord(c) for c in text]

    messages = [{"role": "system", "content": "x", "cache": True}, {"role": "user", "content": "y"}]
    with caplog.at_level(logging.WARNING):
        assert chat_breakpoints(Rewriting(), messages, [1, 2, 3]) == []
    assert "cache breakpoint after message 0 dropped" in caplog.text


def test_copy_slots_copies_the_first_slots_in_every_layer_of_its_group(tiny_engine):
    runner = tiny_engine.runner
    size = runner.block_size
    saved = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    try:
        for k, v in runner.kv_caches:
            k[: 4 * size].normal_()
            v[: 4 * size].normal_()
        before = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
        runner.copy_blocks([BlockCopy("full", 1, 3, 5)])
        for (k, v), (k0, v0) in zip(runner.kv_caches, before, strict=True):
            assert torch.equal(k[3 * size : 3 * size + 5], k0[size : size + 5])
            assert torch.equal(v[3 * size : 3 * size + 5], v0[size : size + 5])
            assert torch.equal(k[3 * size + 5 : 4 * size], k0[3 * size + 5 : 4 * size])
            assert torch.equal(k[: 3 * size], k0[: 3 * size])
        runner.copy_blocks([BlockCopy("sliding", 1, 2, 5)])  # no sliding layers: nothing changes
        for (k, _), (k0, _) in zip(runner.kv_caches, before, strict=True):
            assert torch.equal(k[2 * size : 3 * size], k0[2 * size : 3 * size])
    finally:
        for (k, v), (k0, v0) in zip(runner.kv_caches, saved, strict=True):
            k.copy_(k0)
            v.copy_(v0)
