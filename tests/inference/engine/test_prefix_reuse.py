"""Lost-token accounting: every prompt token in exactly one bucket, and each bucket exact."""

import random
import uuid

import pytest

from inference.engine import SamplingParams
from inference.engine.kv.prefix_reuse import PrefixReuse
from inference.engine.request import Request
from tests.inference.engine.helpers import tiny_kv_cache_manager


def buckets(reuse: PrefixReuse) -> tuple[int, int, int, int, int]:
    return (
        reuse.num_reused_tokens,
        reuse.num_lost_to_retention,
        reuse.num_lost_to_alignment,
        reuse.num_lost_to_eviction,
        reuse.num_cold_tokens,
    )


def test_from_positions_splits_the_prompt():
    reuse = PrefixReuse.from_positions(
        100, reused=32, checkpoint_evicted_upto=48, reusable=64, matched=70, evicted_upto=80
    )
    assert buckets(reuse) == (32, 16, 6, 16 + 10, 20)
    assert sum(buckets(reuse)) == 100


def expected_reuse(interval, block, shared_blocks_tokens, first_prompt_len):
    if interval is None:
        return shared_blocks_tokens
    if interval == 0:
        prompt_end = first_prompt_len // block * block
        return prompt_end if prompt_end <= shared_blocks_tokens else 0
    return shared_blocks_tokens // interval * interval


@pytest.mark.parametrize("hybrid", [True, False])
def test_random_heads_reuse_the_grid_and_lose_the_rest_to_retention_and_alignment(hybrid):
    rng = random.Random(11 if hybrid else 12)
    for _ in range(150):
        block = rng.choice([2, 4, 8, 16])
        window = block * rng.randrange(1, 6) + rng.choice([0, 1])
        interval = rng.choice([None, 0, block, 2 * block, 4 * block, 8 * block])
        manager = tiny_kv_cache_manager(
            512,
            block,
            sliding_window=window if hybrid else None,
            retention_interval=interval,
        )
        first_len = rng.randrange(2, 120)
        a = Request("a", [rng.randrange(100, 200) for _ in range(first_len)], SamplingParams())
        hits, _ = manager.get_computed_blocks(a)
        assert manager.allocate_slots(a, a.num_tokens, hits) is not None
        a.num_computed_tokens = a.num_tokens
        shared = rng.randrange(0, first_len)
        tail = [rng.randrange(300, 400) for _ in range(rng.randrange(1, 20))]
        b = Request("b", a.prompt_token_ids[:shared] + tail, SamplingParams())
        hits, num_hit = manager.get_computed_blocks(b)
        reuse = hits.reuse
        whole = shared // block * block
        reused = expected_reuse(interval, block, whole, first_len) if hybrid else whole
        # Tokens past the last shared block match a cached block only if a filled that block;
        # a's unfilled last block was never cached: those tokens are cold.
        aligned = shared - whole if whole + block <= first_len else 0
        cold = b.num_prompt_tokens - whole - aligned
        assert sum(buckets(reuse)) == b.num_prompt_tokens
        assert num_hit == reused
        assert buckets(reuse) == (reused, whole - reused, aligned, 0, cold), (
            block, window, interval, first_len, shared)  # fmt: skip


def test_engine_metrics_carry_the_accounting(tiny_engine):
    salt = uuid.uuid4().hex
    head = list(range(100, 150))  # 50 tokens: 3 full blocks and 2 more tokens
    params = SamplingParams(max_tokens=1, cache_salt=salt)
    first = tiny_engine.generate([*head, *range(7, 21)], params)[0].metrics  # 4 full blocks
    assert (first.num_cached_tokens, first.num_cold_tokens) == (0, 64)
    before = tiny_engine.stats()
    out = tiny_engine.generate([*head, 1, 2, 3, 4], params)[0].metrics
    # Token-exact: 3 whole blocks, then 2 slots copied from the first prompt's 4th block.
    assert out.num_cached_tokens == 50 and out.reuse_source == "block_chain"
    assert (out.num_lost_to_alignment, out.num_lost_to_retention) == (0, 0)
    assert (out.num_lost_to_eviction, out.num_cold_tokens) == (0, 4)
    assert out.lost_tokens() == {"retention": 0, "alignment": 0, "eviction": 0}
    after = tiny_engine.stats()
    assert after.num_lost_to_alignment - before.num_lost_to_alignment == 0
    assert after.num_cold_tokens - before.num_cold_tokens == 4
    assert after.prefix_cache_hits - before.prefix_cache_hits == 50
    assert after.num_partial_block_copies - before.num_partial_block_copies == 1


def test_another_tenants_blocks_are_cold_not_alignment():
    manager = tiny_kv_cache_manager(32, 4)
    a = Request("a", list(range(12)), SamplingParams(cache_salt="tenant-1"))
    hits, _ = manager.get_computed_blocks(a)
    manager.allocate_slots(a, 12, hits)
    b = Request("b", [0, 1, 2, 9, 9], SamplingParams(cache_salt="tenant-2"))
    hits, _ = manager.get_computed_blocks(b)
    assert buckets(hits.reuse) == (0, 0, 0, 0, 5)
    c = Request("c", [0, 1, 2, 9, 9], SamplingParams(cache_salt="tenant-1"))
    hits, _ = manager.get_computed_blocks(c)
    assert buckets(hits.reuse) == (0, 0, 3, 0, 2)
