"""warm / unpin: a pinned head survives cache pressure and is reused whole; pins are bounded."""

import random

import pytest

from inference.engine import EngineConfig, LLMEngine, SamplingParams


@pytest.fixture(scope="module")
def engine():
    config = EngineConfig(
        model="gemma3-tiny-random", num_kv_blocks=120, retention_interval=4096, block_size=16
    )
    engine = LLMEngine(config)
    yield engine
    engine.shutdown()


def tokens(rng, n):
    return [rng.randrange(1000, 200_000) for _ in range(n)]


def test_a_pinned_head_survives_pressure_and_is_reused_whole(engine):
    rng = random.Random(1)
    head = tokens(rng, 601)
    handle = engine.warm(head, pin=True)
    assert (handle.num_tokens, handle.num_pinned_tokens) == (601, 601)
    assert engine.stats().num_pinned_blocks > 0
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    for _ in range(6):  # 6 × 900 cold tokens through a 120-block pool: evicts everything else
        engine.generate(tokens(rng, 900), params)
    out = engine.generate(head + tokens(rng, 30), params)[0].metrics
    assert (out.num_cached_tokens, out.reuse_source) == (601, "pinned")
    engine.unpin(handle)
    assert engine.stats().num_pinned_blocks == 0
    for _ in range(6):
        engine.generate(tokens(rng, 900), params)
    out = engine.generate(head + tokens(rng, 30), params)[0].metrics
    assert out.num_cached_tokens == 0 and out.num_lost_to_eviction > 0
    with pytest.raises(ValueError, match="no pinned head"):
        engine.unpin(handle)


def test_pins_beyond_the_share_are_a_value_error(engine):
    rng = random.Random(2)
    with pytest.raises(ValueError, match="max_pinned_fraction"):
        engine.warm(tokens(rng, 61 * 16), pin=True)  # 61 of 120 blocks > 0.5
    with pytest.raises(ValueError, match="max_pinned_fraction must be"):
        EngineConfig(max_pinned_fraction=1.5)


def test_a_warmed_chat_head_is_reused_whole_on_a_full_attention_model(make_tiny_engine):
    engine = make_tiny_engine(num_kv_blocks=40)
    head = [{"role": "system", "content": "Town rules and the place list. " * 12}]
    handle = engine.warm(head, pin=True)
    num_head = len(engine.tokenizer.apply_chat_template(head, add_generation_prompt=False))
    assert (handle.num_tokens, handle.num_pinned_tokens) == (num_head, num_head)
    rng = random.Random(3)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    for _ in range(4):  # pressure: 4 × 400 cold tokens through a 40-block pool
        engine.generate([rng.randrange(1000, 40_000) for _ in range(400)], params)
    prompt = [*head, {"role": "user", "content": "You are Hana. Where to?"}]
    out = engine.generate(prompt, params)[0].metrics
    assert out.num_cached_tokens >= num_head and out.reuse_source == "pinned"
    engine.unpin(handle)
