"""DeepSeek's bounded replay on deepseek-v4-tiny-random (enable_bounded_replay, approximate):
a prefix whose window state was not kept resumes a window early, at a multiple of 128, over
the cached compressed state; such hits say so, and nothing a replay computes is ever taken for
exact state by a later request."""

from __future__ import annotations

import random

import pytest

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from tests.inference.engine.helpers import ROUNDING, accounted, smollm2_tokens

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def test_a_head_without_a_kept_window_resumes_by_replay(make_v4_engine):
    """Interval 4,096 keeps no window in a 300-token head: the exact path reuses nothing; the
    replay resumes at 128 (the last multiple of 128 a window before the 288 matched tokens) and
    recomputes 160 tokens over the cached compressed state."""
    exact = make_v4_engine(retention_interval=4096, **ROUNDING)
    replay = make_v4_engine(retention_interval=4096, enable_bounded_replay=True, **ROUNDING)
    rng = random.Random(1)
    head = smollm2_tokens(rng, 300)
    first, second = head + smollm2_tokens(rng, 10), head + smollm2_tokens(rng, 10)
    for engine in (exact, replay):
        engine.generate(first, GREEDY)
    exact_out = exact.generate(second, GREEDY)[0]
    replay_out = replay.generate(second, GREEDY)[0]
    assert exact_out.metrics.num_cached_tokens == 0
    assert exact_out.metrics.reuse_source == "none"
    m = replay_out.metrics
    assert (m.reuse_source, m.num_cached_tokens, m.num_replayed_tokens) == ("replay", 128, 160)
    assert m.num_lost_to_retention == 160 and accounted(m) == m.num_prompt_tokens
    assert replay.stats().reuse_sources.get("replay") == 1
    assert len(replay_out.token_ids) == 6


def test_an_exact_hit_is_preferred_and_replay_is_off_by_default(make_v4_engine):
    """Dense retention keeps the window: the exact hit reaches further than a replay could, so
    no replay; without the option no request ever replays."""
    rng = random.Random(2)
    head = smollm2_tokens(rng, 300)
    dense = make_v4_engine(enable_bounded_replay=True, **ROUNDING)
    dense.generate(head + smollm2_tokens(rng, 10), GREEDY)
    out = dense.generate(head + smollm2_tokens(rng, 10), GREEDY)[0]
    assert out.metrics.reuse_source == "block_chain" and out.metrics.num_cached_tokens == 288
    default = make_v4_engine(retention_interval=4096, **ROUNDING)
    default.generate(head + smollm2_tokens(rng, 10), GREEDY)
    assert (
        default.generate(head + smollm2_tokens(rng, 10), GREEDY)[0].metrics.num_replayed_tokens == 0
    )


def test_a_replays_state_never_feeds_a_later_request(make_v4_engine):
    """After a replayed request, a prompt that extends it (its prompt and output, then more)
    reuses nothing past the first prompt's exact state: the replay's blocks are hashed apart
    and it kept no window. Repeating the replayed prompt replays again, identically."""
    engine = make_v4_engine(retention_interval=4096, enable_bounded_replay=True, **ROUNDING)
    rng = random.Random(3)
    head = smollm2_tokens(rng, 300)
    first = head + smollm2_tokens(rng, 100)
    engine.generate(first, GREEDY)
    second = head + smollm2_tokens(rng, 100)
    replayed = engine.generate(second, GREEDY)[0]
    assert replayed.metrics.reuse_source == "replay"
    extended = second + replayed.token_ids + smollm2_tokens(rng, 40)
    later = engine.generate(extended, GREEDY)[0].metrics
    # at most what the first prompt's exact blocks support (its 300 shared tokens, block-rounded)
    assert later.num_cached_tokens + later.num_replayed_tokens <= 288
    again = engine.generate(second, GREEDY)[0]
    assert again.metrics.reuse_source == "replay"
    assert again.token_ids == replayed.token_ids


def test_replay_needs_a_model_with_compressed_state():
    with pytest.raises(ValueError, match="DeepSeek"):
        LLMEngine(EngineConfig(model="gemma3-tiny-random", enable_bounded_replay=True))


def test_a_replay_computes_what_its_definition_says(make_v4_engine):
    """The engine's replayed prefill equals the model run directly with that state: the whole
    prefix [0, 128) computed, then [128, n) with no window state before 128 (its sliding keys
    and CSA's overlapping window start there) over the compressed entries of [0, 128)."""
    import torch

    from inference.engine.attention.attention_backend import GroupSpans, ScheduledSpan

    engine = make_v4_engine(retention_interval=4096, enable_bounded_replay=True, **ROUNDING)
    rng = random.Random(4)
    head = smollm2_tokens(rng, 300)
    engine.generate(head + smollm2_tokens(rng, 10), GREEDY)
    prompt = head + smollm2_tokens(rng, 10)
    captured = []
    model = engine.runner.model
    hook = model.register_forward_hook(
        lambda m, i, out: captured.append(out[0].clone()) if out.shape[0] else None
    )
    try:
        replayed = engine.generate(prompt, SamplingParams(max_tokens=1, temperature=0.0))[0]
    finally:
        hook.remove()
    assert replayed.metrics.num_cached_tokens == 128
    n, start, size = len(prompt), 128, 16
    blocks = list(range(-(-n // size)))
    state = model.config.paged_state_spec().allocate(
        len(blocks), len(blocks), size, torch.float32, torch.device("cpu")
    )
    builder = model.config.paged_state_spec().metadata_builder(size, torch.device("cpu"))
    for lo, hi, window_start in ((0, start, 0), (start, n, start)):
        first = window_start // size
        full = GroupSpans(list(range(lo, hi)), [ScheduledSpan(0, hi - lo, lo, blocks)])
        window = GroupSpans(
            list(range(lo, hi)),
            [ScheduledSpan(0, hi - lo, lo, blocks[first:], first, window_start)],
        )
        with engine._lock:
            logits = model(
                torch.tensor(prompt[lo:hi]),
                torch.arange(lo, hi),
                state.layers,
                builder.build(full, window),
                torch.tensor([hi - lo - 1]),
            )
    expected = logits[0]
    assert float((captured[-1] - expected).abs().max() / expected.abs().max()) < 1e-4
