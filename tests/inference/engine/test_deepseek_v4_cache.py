"""DeepSeek-V4's paged state in the engine (deepseek-v4-tiny-random): exact entry counts in the
compressed pools, hits at retention checkpoints (also where the HCA buffer is not empty),
evictions accounted for, and continuous batching with preemption giving the outputs each
prompt gets alone."""

from __future__ import annotations

import json
import random

import pytest
import torch

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.models.deepseek_v4.tiny import NAME
from tests.inference.engine.helpers import ROUNDING, accounted, smollm2_tokens

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def cold():
    engine = LLMEngine(EngineConfig(model=NAME, num_kv_blocks=128, enable_prefix_caching=False))
    yield engine
    engine.shutdown()


def filled_rows(pool: torch.Tensor) -> int:
    """Rows of a fresh (zeroed) pool that hold an entry: entries are RMS-normed, never 0."""
    return int((pool.abs().amax(dim=-1) > 0).sum())


def test_a_prompt_leaves_one_entry_per_closed_window(make_v4_engine):
    """300 prompt tokens (the one sampled token is never run through the model): 75 CSA
    entries and 75 indexer keys per CSA layer, 2 HCA entries per HCA layer, at their blocks."""
    engine = make_v4_engine()
    engine.generate(smollm2_tokens(random.Random(1), 300), SamplingParams(max_tokens=1))
    state = engine.runner.state
    assert state.csa_entries.shape[0] == state.hca_entries.shape[0] == 2  # two layers each
    for layer in range(2):
        assert filled_rows(state.csa_entries[layer]) == 300 // 4
        assert filled_rows(state.csa_index_entries[layer]) == 300 // 4
        assert filled_rows(state.hca_entries[layer]) == 300 // 128
    # one block's rows hold 16 / 4 CSA entries; an HCA entry sits in the block of its last token
    assert state.csa_entries.shape[1] == 128 * 4 and state.hca_entries.shape[1] == 128


@pytest.mark.parametrize(("interval", "reused"), [(128, 256), (96, 288), (None, 288)])
def test_hits_round_down_to_retention_checkpoints_and_resume_exactly(
    make_v4_engine, cold, interval, reused
):
    """A 300-token head: kept window checkpoints every 128 → hit 256 (every buffer empty);
    every 96 → 288, where HCA's buffer holds 32 tokens and CSA's overlap is live; dense → the
    last full block. The rest is accounted as lost to retention and to alignment."""
    engine = make_v4_engine(retention_interval=interval, **ROUNDING)
    rng = random.Random(interval or 0)
    head = smollm2_tokens(rng, 300)
    engine.generate(head + smollm2_tokens(rng, 10), GREEDY)
    prompt = head + smollm2_tokens(rng, 10)
    second = engine.generate(prompt, GREEDY)[0]
    metrics = second.metrics
    assert metrics.num_cached_tokens == reused
    assert metrics.num_lost_to_retention == 288 - reused
    assert metrics.num_lost_to_alignment == 300 - 288
    assert accounted(metrics) == metrics.num_prompt_tokens
    assert second.token_ids == cold.generate(prompt, GREEDY)[0].token_ids
    if interval is not None:  # the window checkpoints kept: exactly the grid's positions
        kept = sorted(set(engine.kv_cache_manager.sliding.checkpoints.values()))
        assert kept == list(range(interval, 310, interval))


def test_an_evicted_head_is_accounted_and_recomputed(make_v4_engine, cold):
    """A pool of 30 blocks (20 hold one prompt): a second 300-token prompt evicts the first
    one's blocks; the first prompt again reuses what is left, counts the rest as lost to
    eviction, and answers as a cold engine does."""
    engine = make_v4_engine(num_kv_blocks=30)
    rng = random.Random(7)
    first, other = smollm2_tokens(rng, 300), smollm2_tokens(rng, 300)
    engine.generate(first, GREEDY)
    engine.generate(other, GREEDY)
    again = engine.generate(first, GREEDY)[0]
    assert again.metrics.num_lost_to_eviction > 0
    assert accounted(again.metrics) == again.metrics.num_prompt_tokens
    assert again.token_ids == cold.generate(first, GREEDY)[0].token_ids


def test_batching_and_preemption_give_each_prompt_its_own_output(make_v4_engine, cold):
    """Five prompts at once in a pool too small for all of them (preemptions happen), chunked
    at 64 tokens: each output is the one the prompt gets alone."""
    engine = make_v4_engine(num_kv_blocks=48, max_num_batched_tokens=64, max_num_seqs=5)
    rng = random.Random(3)
    prompts = [smollm2_tokens(rng, n) for n in (150, 260, 90, 200, 140)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    together = engine.generate(prompts, params)
    assert engine.stats().num_preemptions > 0
    for prompt, output in zip(prompts, together, strict=True):
        assert output.token_ids == cold.generate(prompt, params)[0].token_ids


def test_a_town_shaped_request_answers_valid_json(cold):
    """Chat messages through SmolLM2's template and a JSON schema over the 49,152-token
    vocabulary: the constrained answer parses and validates, as the town needs."""
    schema = {
        "type": "object",
        "properties": {
            "action": {"enum": ["go", "rest", "buy"]},
            "reason": {"type": "string", "maxLength": 12},
        },
        "required": ["action", "reason"],
        "additionalProperties": False,
    }
    messages = [{"role": "user", "content": "You are at the bakery at noon. What do you do?"}]
    params = SamplingParams(max_tokens=60, temperature=0.0, json_schema=schema)
    output = cold.generate([messages], params)[0]
    assert output.finish_reason == "stop"
    answer = json.loads(output.text)
    assert answer["action"] in ("go", "rest", "buy") and len(answer["reason"]) <= 12


def test_window_tails_have_a_budget_of_their_own(make_v4_engine, cold):
    """A full group of 256 blocks (4,096 tokens of compressed prefix) beside a window group of
    24: the window tails are evicted among themselves, the compressed prefixes stay, and a
    prompt resumes from its kept checkpoint exactly."""
    engine = make_v4_engine(num_kv_blocks=256, num_window_blocks=24, retention_interval=128)
    assert engine.runner.state.window.shape[1] == 24 * 16
    assert engine.runner.state.csa_entries.shape[1] == 256 * 4
    rng = random.Random(11)
    heads = [smollm2_tokens(rng, 300) for _ in range(4)]
    for head in heads:  # four heads' compressed entries fit; their windows cannot all stay
        engine.generate(head + smollm2_tokens(rng, 5), GREEDY)
    prompt = heads[-1] + smollm2_tokens(rng, 5)
    again = engine.generate(prompt, GREEDY)[0]
    assert again.metrics.num_cached_tokens == 256  # the last checkpoint of the newest head
    assert accounted(again.metrics) == again.metrics.num_prompt_tokens
    assert again.token_ids == cold.generate(prompt, GREEDY)[0].token_ids
    oldest = engine.generate(heads[0] + smollm2_tokens(rng, 5), GREEDY)[0].metrics
    assert oldest.num_cold_tokens == 5  # its whole head is still in the compressed group...
    assert oldest.num_lost_to_eviction == 256  # ...but its window checkpoints were evicted


def test_a_window_budget_too_small_for_one_request_is_refused():
    with pytest.raises(ValueError, match="window group has 8 blocks"):
        LLMEngine(EngineConfig(model=NAME, num_kv_blocks=64, num_window_blocks=8))
    with pytest.raises(ValueError, match="only DeepSeek-V4"):
        LLMEngine(EngineConfig(model="smollm2-tiny-random", window_cache_fraction=0.5))
