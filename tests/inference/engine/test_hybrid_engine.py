"""The engine on a hybrid sliding-window model (gemma3-tiny-random: 5 sliding layers with the
real 512-token window to 1 global): the talk's retention numbers, exact; outputs with reuse
identical to outputs without; lost-token accounting that adds up."""

import logging
import random

import pytest

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from tests.inference.engine.helpers import ROUNDING, accounted, random_tokens

GREEDY = dict(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize(
    ("interval", "head", "reused"),
    [(4096, 2247, 0), (2048, 2247, 2048), (1024, 3362, 3072), (None, 2247, 2240)],
)
def test_the_talks_numbers_reproduce(make_hybrid_engine, interval, head, reused):
    """Shared head 2,247 tokens: nothing at interval 4,096, 2,048 at 2,048; head 3,362: 3,072 at
    1,024. The rest of the head is lost to retention, its partial last block to alignment.
    (With vLLM's rounding; test_exact_reuse has the same heads reused whole.)"""
    engine = make_hybrid_engine(retention_interval=interval, **ROUNDING)
    rng = random.Random(head)
    shared = random_tokens(rng, head)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    first = engine.generate(shared + random_tokens(rng, 40), params)[0].metrics
    second = engine.generate(shared + random_tokens(rng, 40), params)[0].metrics
    assert first.num_cached_tokens == 0 and first.num_cold_tokens == head + 40
    assert second.num_cached_tokens == reused
    block_rounded = head // 16 * 16
    assert second.num_lost_to_retention == block_rounded - reused
    assert second.num_lost_to_alignment == head - block_rounded
    assert second.num_lost_to_eviction == 0 and second.num_cold_tokens == 40
    assert accounted(second) == second.num_prompt_tokens
    stats = engine.stats()
    assert stats.prefix_cache_hits == reused
    assert stats.num_lost_to_retention == block_rounded - reused
    assert (stats.num_checkpoints > 0) == (stats.checkpoint_memory_bytes > 0) == (reused > 0)


def test_outputs_with_reuse_equal_outputs_without(make_hybrid_engine):
    rng = random.Random(99)
    base = random_tokens(rng, 1400)
    prompts = [base]
    for _ in range(5):
        shared = rng.randrange(200, len(base))
        prompts.append(base[:shared] + random_tokens(rng, rng.randrange(1, 60)))
    prompts.append(list(base[:1024]))  # a prefix of the first prompt, whole
    prompts.append(prompts[2] + random_tokens(rng, 20))  # a follow-up turn: its prompt end hits
    uncached = make_hybrid_engine(enable_prefix_caching=False).generate(
        prompts, SamplingParams(**GREEDY)
    )
    expected = [out.token_ids for out in uncached]
    for interval in (None, 0, 256, 512):
        engine = make_hybrid_engine(retention_interval=interval)
        outs = [engine.generate(p, SamplingParams(**GREEDY))[0] for p in prompts]
        assert [out.token_ids for out in outs] == expected, interval
        assert all(accounted(out.metrics) == len(p) for out, p in zip(outs, prompts, strict=True))
        reused = sum(out.metrics.num_cached_tokens for out in outs)
        assert reused > 0, interval


def test_batched_and_chunked_requests_with_a_small_pool_match_uncached(make_hybrid_engine):
    """Requests in flight together, prefilled in chunks, with a pool small enough to preempt."""
    rng = random.Random(5)
    head = random_tokens(rng, 700)
    prompts = [head[: rng.randrange(300, 700)] + random_tokens(rng, 30) for _ in range(6)]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    expected = [
        o.token_ids
        for o in make_hybrid_engine(enable_prefix_caching=False).generate(prompts, params)
    ]
    small = dict(retention_interval=128, num_kv_blocks=50, max_num_batched_tokens=256)
    # Each prefilling on its own: the pool runs out, requests are preempted, blocks evicted.
    engine = make_hybrid_engine(enable_shared_prefill=False, **small)
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == expected
    stats = engine.stats()
    assert stats.num_preemptions > 0 and stats.num_lost_to_eviction > 0
    assert all(accounted(o.metrics) == len(p) for o, p in zip(outs, prompts, strict=True))
    # One prefill per shared head: followers wait for the leader, so the pool suffices.
    engine = make_hybrid_engine(**small)
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == expected
    assert all(accounted(o.metrics) == len(p) for o, p in zip(outs, prompts, strict=True))


def test_running_sequence_holds_only_its_window_in_the_sliding_group(make_hybrid_engine):
    engine = make_hybrid_engine(max_num_batched_tokens=128)
    rng = random.Random(3)
    prompt = random_tokens(rng, 1500)
    held = []
    manager = engine.kv_cache_manager
    original = manager.allocate_slots

    def spy(request, *args, **kwargs):
        result = original(request, *args, **kwargs)
        if result is not None:
            held.append(manager.sliding.num_held_blocks(request.request_id))
        return result

    manager.allocate_slots = spy
    try:
        engine.generate(prompt, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    finally:
        manager.allocate_slots = original
    # (window - 1 + chunk) / block + 1 blocks at most; the full group holds all 94 blocks.
    assert max(held) <= -(-(512 - 1 + 128) // 16) + 1
    assert len(held) >= 12


def test_retention_interval_on_a_model_without_sliding_layers_logs_a_note(caplog):
    with caplog.at_level(logging.WARNING, logger="inference.engine.core.llm_engine"):
        engine = LLMEngine(
            EngineConfig(model="smollm2-tiny-random", num_kv_blocks=64, retention_interval=64)
        )
    engine.shutdown()
    assert "changes nothing" in caplog.text
    assert engine.kv_cache_manager.sliding is None


def test_interval_not_a_multiple_of_the_block_size_is_a_value_error():
    with pytest.raises(ValueError, match="multiple of block_size"):
        EngineConfig(model="gemma3-tiny-random", retention_interval=1000)
