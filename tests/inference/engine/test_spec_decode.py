"""Speculative decoding (prompt lookup): the drafter, the verification's bookkeeping (accepted
tokens computed, rejected ones never hashed), and greedy exactness on the tiny models — the
output is the same tokens as without speculation, batched, preempted, under a JSON schema,
with stop strings — while drafts are accepted on repetitive text."""

from __future__ import annotations

import random

import pytest

from inference.engine import EngineConfig, SamplingParams
from inference.engine.kv.hashing import hash_request_blocks
from inference.engine.request import Request, RequestStatus
from inference.engine.spec_decode.ngram import NgramProposer
from tests.inference.engine.helpers import (
    random_tokens,
    smollm2_tokens,
    tiny_kv_cache_manager,
    tiny_scheduler,
)

NGRAM = dict(speculative_method="ngram", num_speculative_tokens=4)
# One-token matches: a draft at almost every step, so rejected drafts are exercised on models
# whose random output rarely repeats a longer n-gram.
EAGER = dict(NGRAM, prompt_lookup_min=1)
GREEDY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


# ---- the drafter ----------------------------------------------------------------------------


def test_ngram_proposes_what_followed_the_longest_recurring_suffix():
    proposer = NgramProposer(1, 3)
    #        the suffix [7, 8, 9] recurs at 2; [8, 9] alone also at 6 (shorter: loses)
    tokens = [1, 2, 7, 8, 9, 4, 5, 8, 9, 6, 0, 7, 8, 9]
    assert proposer.propose(tokens, 3) == [4, 5, 8]
    assert proposer.propose(tokens, 1) == [4]


def test_ngram_takes_the_latest_occurrence_with_a_full_draft_else_the_earliest():
    proposer = NgramProposer(2, 2)
    tokens = [5, 6, 1, 2, 5, 6, 3, 4, 0, 5, 6]
    assert proposer.propose(tokens, 2) == [3, 4]  # the latest [5, 6] with two tokens after
    assert proposer.propose(tokens, 7) == [1, 2, 5, 6, 3, 4, 0]  # only the first has 7 after
    assert proposer.propose(tokens, 10) == [1, 2, 5, 6, 3, 4, 0, 5, 6]  # none: the earliest


def test_ngram_proposes_nothing_without_a_recurring_suffix_or_room():
    proposer = NgramProposer(2, 4)
    assert proposer.propose([1, 2, 3, 4, 5], 4) == []
    assert proposer.propose([1, 2, 1, 2], 0) == []
    assert proposer.propose([1, 2], 4) == []
    with pytest.raises(ValueError, match="min_n"):
        NgramProposer(3, 2)


def test_speculative_config_is_checked():
    with pytest.raises(ValueError, match="speculative_method"):
        EngineConfig(speculative_method="eagle")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        EngineConfig(speculative_method="ngram", num_speculative_tokens=0)
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        EngineConfig(prompt_lookup_min=3, prompt_lookup_max=2)
    with pytest.raises(ValueError, match="below max_num_batched_tokens"):
        EngineConfig(num_speculative_tokens=16, max_num_batched_tokens=16)
    config = EngineConfig(**NGRAM)
    assert config.speculative.speculative_method == "ngram"


def test_mtp_on_a_model_without_an_mtp_layer_is_refused(make_tiny_engine):
    with pytest.raises(ValueError, match="multi-token-prediction"):
        make_tiny_engine(speculative_method="mtp")


# ---- verification's bookkeeping ---------------------------------------------------------------

BLOCK = 4


def test_a_rejected_draft_is_not_computed_nor_hashed_and_accepted_tokens_are():
    manager = tiny_kv_cache_manager(32, BLOCK)
    scheduler = tiny_scheduler(
        manager,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        max_model_len=64,
        drafter=NgramProposer(1, 2),
        num_speculative_tokens=4,
    )
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    a = Request("a", [1, 2, 3, 4, 5, 1, 2], params)
    scheduler.add_request(a)
    out = scheduler.schedule()
    scheduler.update_from_output(out, {"a": 3})  # prompt computed, 3 sampled
    out = scheduler.schedule()
    (scheduled,) = out.scheduled
    assert scheduled.draft_token_ids == [4, 5, 1, 2]  # what followed [2, 3] at 1
    assert scheduled.num_new_tokens == 5
    # Blocks are registered for the tokens it holds, never for the draft's.
    assert manager.coordinator.full.num_cached_blocks["a"] == 2
    # The model agrees on 4 and 5, then says 9: two accepted, 9 is the bonus.
    scheduler.update_from_output(out, {"a": [4, 5, 9, 7, 7]})
    assert a.output_token_ids == [3, 4, 5, 9]
    assert a.num_computed_tokens == 10  # 7 prompt + 3, 4, 5; 9 is next
    assert (a.num_draft_tokens, a.num_accepted_tokens) == (4, 2)
    out = scheduler.schedule()
    manager.hasher.update(a)
    extra = manager.hasher.extra(a)
    assert a.block_hashes == hash_request_blocks(a.all_token_ids, BLOCK, extra, [])
    cached = manager.block_pool.get_cached_block(a.block_hashes[1], (3, 1, 2, 3))
    assert cached is None  # block 1 holds [5, 1, 2, 3]; the rejected draft's tokens are nowhere
    assert manager.block_pool.get_cached_block(a.block_hashes[1], (5, 1, 2, 3)) is not None
    stats = scheduler.make_stats()
    assert (stats.num_spec_verifications, stats.num_draft_tokens) == (1, 4)
    assert stats.num_accepted_tokens == 2


def test_a_draft_never_passes_max_tokens_and_sampled_requests_get_none():
    manager = tiny_kv_cache_manager(32, BLOCK)
    scheduler = tiny_scheduler(
        manager,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        drafter=NgramProposer(1, 2),
        num_speculative_tokens=4,
    )
    a = Request("a", [1, 2, 3, 1, 2], SamplingParams(max_tokens=3, temperature=0.0))
    b = Request("b", [1, 2, 3, 1, 2], SamplingParams(max_tokens=9, temperature=0.8))
    for r in (a, b):
        scheduler.add_request(r)
    out = scheduler.schedule()
    scheduler.update_from_output(out, {"a": 3, "b": 3})
    out = scheduler.schedule()
    drafts = {s.request.request_id: s.draft_token_ids for s in out.scheduled}
    assert drafts == {"a": [1], "b": []}  # a may append 2 more: one draft + the model's own
    finished = scheduler.update_from_output(out, {"a": [1, 2], "b": 1})
    assert finished == [a] and a.output_token_ids == [3, 1, 2]
    assert a.status == RequestStatus.FINISHED_LENGTH


# ---- greedy exactness on the tiny models ------------------------------------------------------


def _outputs(engine, prompts, params):
    return engine.generate(prompts, params)


def _check_same(make, prompts, params, spec=NGRAM, **overrides):
    """Outputs with and without speculation; returns the speculative run's outputs and stats."""
    plain = make(**overrides)
    expected = [o.token_ids for o in _outputs(plain, prompts, params)]
    spec = make(**overrides, **spec)
    outputs = _outputs(spec, prompts, params)
    assert [o.token_ids for o in outputs] == expected
    stats = spec.stats()
    assert stats.num_draft_tokens == sum(o.metrics.num_draft_tokens for o in outputs)
    return outputs, stats


def _prompts(rng, repeat_vocab):
    loop = repeat_vocab(rng, 7)
    return [loop * 6, repeat_vocab(rng, 30), repeat_vocab(rng, 9) * 3 + repeat_vocab(rng, 5)]


def test_llama_outputs_are_unchanged_and_drafts_are_accepted(make_tiny_engine):
    rng = random.Random(0)
    outputs, stats = _check_same(make_tiny_engine, _prompts(rng, smollm2_tokens), GREEDY)
    assert stats.num_accepted_tokens > 0
    assert stats.spec_tokens_per_verification > 1
    assert all(len(o.token_ids) == GREEDY.max_tokens for o in outputs)


def test_llama_outputs_are_unchanged_under_preemption_and_without_prefix_caching(
    make_tiny_engine,
):
    rng = random.Random(1)
    prompts = [smollm2_tokens(rng, 6) * 5 for _ in range(4)]
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    _, stats = _check_same(make_tiny_engine, prompts, params, num_kv_blocks=12, max_num_seqs=4)
    assert stats.num_preemptions > 0 and stats.num_accepted_tokens > 0
    _check_same(make_tiny_engine, prompts, params, enable_prefix_caching=False)


def test_stop_strings_end_at_the_same_token(make_tiny_engine):
    rng = random.Random(2)
    prompts = _prompts(rng, smollm2_tokens)
    plain = make_tiny_engine()
    texts = [o.text for o in plain.generate(prompts, GREEDY)]
    for text in texts:
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        if stop.strip():
            params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop=[stop])
            outputs, _ = _check_same(make_tiny_engine, prompts, params)
            assert any(o.finish_reason == "stop" for o in outputs)
            return
    pytest.fail("no stop string found in the outputs")


SCHEMA = {
    "type": "object",
    "properties": {
        "target": {"type": "string", "enum": ["bakery", "bakery shop", "library", "park"]},
        "note": {"type": "string", "maxLength": 40},
    },
    "required": ["target", "note"],
}


@pytest.mark.parametrize("jump_forward", [True, False])
def test_json_schema_outputs_are_unchanged(make_tiny_engine, jump_forward):
    rng = random.Random(3)
    text = '{"target": "bakery", "note": "bakery bakery"} ' * 4
    prompts = [text, *_prompts(rng, smollm2_tokens)[:2]]
    params = SamplingParams(max_tokens=40, temperature=0.0, json_schema=SCHEMA)
    _, stats = _check_same(
        make_tiny_engine, prompts, params, EAGER, enable_jump_forward=jump_forward
    )
    assert stats.num_draft_tokens > 5 and stats.num_accepted_tokens > 0


def test_gemma3_sliding_window_outputs_are_unchanged(make_hybrid_engine):
    """Prompts past the 512-token window: rejected drafts must not disturb the windows."""
    rng = random.Random(4)
    loop = random_tokens(rng, 11)
    prompts = [random_tokens(rng, 500) + loop * 6, random_tokens(rng, 40) + loop * 3]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    _, stats = _check_same(make_hybrid_engine, prompts, params, EAGER)
    assert stats.num_accepted_tokens > 0 and stats.num_draft_tokens > stats.num_accepted_tokens


def test_deepseek_v4_outputs_are_unchanged(make_v4_engine):
    """Compressed entries written from a rejected draft are rewritten when the real tokens
    close their window (entries and windows are kept by position)."""
    rng = random.Random(5)
    loop = smollm2_tokens(rng, 9)
    prompts = [smollm2_tokens(rng, 150) + loop * 5, loop * 3]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    _, stats = _check_same(make_v4_engine, prompts, params, EAGER)
    assert stats.num_draft_tokens > 10
