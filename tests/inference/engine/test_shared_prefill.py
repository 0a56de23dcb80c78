"""One prefill per shared head: 8 requests sharing an uncached 1,500-token head, submitted at
once, compute it once (the engine's prefill-token count is head + 8 tails); outputs equal the
uncached engine's. Off, each request prefills what the cache lacks when it is admitted."""

import random

import pytest

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.kv.shared_prefill import find_followers
from inference.engine.request import Request

HEAD, TAIL, N = 1500, 60, 8


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(8)
    head = [rng.randrange(1000, 200_000) for _ in range(HEAD)]
    return [head + [rng.randrange(1000, 200_000) for _ in range(TAIL)] for _ in range(N)]


def fan_out(prompts, **overrides):
    config = dict(model="gemma3-tiny-random", num_kv_blocks=1200, retention_interval=4096)
    engine = LLMEngine(EngineConfig(**{**config, **overrides}))
    try:
        params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        outs = engine.generate(prompts, params)  # one call: all in the same step
        return outs, engine.stats()
    finally:
        engine.shutdown()


def test_a_shared_head_is_prefilled_once(prompts):
    outs, stats = fan_out(prompts)
    assert stats.num_prefill_tokens == HEAD + N * TAIL
    cached = sorted(o.metrics.num_cached_tokens for o in outs)
    assert cached == [0] + [HEAD] * (N - 1)
    assert stats.reuse_sources == {"none": 1, "junction": N - 1}
    off, off_stats = fan_out(prompts, enable_shared_prefill=False)
    assert off_stats.num_prefill_tokens > HEAD + N * TAIL
    uncached, _ = fan_out(prompts, enable_prefix_caching=False)
    expected = [o.token_ids for o in uncached]
    assert [o.token_ids for o in outs] == [o.token_ids for o in off] == expected


def test_followers_wait_only_for_an_unfinished_leader():
    head = list(range(100, 164))
    a = Request("a", [*head, 1, 2], SamplingParams())
    b = Request("b", [*head, 3, 4], SamplingParams())
    c = Request("c", [*head[:10], 5], SamplingParams())  # shares less than a block: leads
    other = Request("d", [*head, 6], SamplingParams(cache_salt="tenant"))  # another tenant
    followers = find_followers([], [a, b, c, other], block_size=16, junctions={})
    assert followers == {"b": (a, 64)}
    a.num_computed_tokens = 64  # the leader computed the shared part in an earlier step
    assert find_followers([a], [b], block_size=16, junctions={}) == {}


def test_a_follower_waits_until_the_block_holding_the_leaders_junction_is_full():
    head = list(range(100, 170))  # 70 tokens: the shared point lies inside block 4
    a = Request("a", [*head, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], SamplingParams())
    b = Request("b", [*head, 11, 12], SamplingParams())
    a.num_computed_tokens = 75  # past the shared point, short of the block's end (80)
    assert find_followers([a], [b], block_size=16, junctions={"a": [70]}) == {"b": (a, 70)}
    # Without a junction there, no checkpoint is coming: b is admitted at once.
    assert find_followers([a], [b], block_size=16, junctions={"a": [64]}) == {}
    a.num_computed_tokens = 80
    assert find_followers([a], [b], block_size=16, junctions={"a": [70]}) == {}
