"""Two KV groups on tiny configs: window release, checkpoints, reuse points, exact block ids."""

from inference.engine.kv.kv_cache_manager import KVCacheManager
from inference.engine.request import Request
from inference.engine.sampling_params import SamplingParams
from tests.inference.engine.helpers import tiny_kv_cache_manager

BLOCK = 4


def make_manager(window=8, interval=16, num_blocks=32, num_sliding_blocks=None, caching=True):
    return tiny_kv_cache_manager(
        num_blocks,
        BLOCK,
        enable_prefix_caching=caching,
        sliding_window=window,
        retention_interval=interval,
        num_sliding_blocks=num_sliding_blocks,
    )


def make_request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=4))


def prefill(manager: KVCacheManager, request: Request, chunk: int = 8) -> int:
    """Admit a request and prefill its prompt in chunks, as the scheduler and engine would."""
    hits, num_hit = manager.get_computed_blocks(request)
    first = min(chunk, request.num_tokens - num_hit)
    assert manager.allocate_slots(request, first, hits) is not None
    request.num_cached_tokens, request.reuse = num_hit, hits.reuse
    request.num_computed_tokens = num_hit + first
    while request.num_computed_tokens < request.num_tokens:
        step = min(chunk, request.num_tokens - request.num_computed_tokens)
        assert manager.allocate_slots(request, step) is not None
        request.num_computed_tokens += step
    return num_hit


def window_ids(manager: KVCacheManager, rid: str) -> tuple[int, list[int]]:
    return manager.get_window_block_ids(rid)


def test_window_slides_and_only_checkpoint_blocks_keep_a_hash():
    manager = make_manager(window=8, interval=16)
    sliding = manager.sliding
    a = make_request("a", range(40))
    hits, _ = manager.get_computed_blocks(a)
    seen = []
    manager.allocate_slots(a, 8, hits)
    seen.append(window_ids(manager, "a"))
    for _ in range(4):
        a.num_computed_tokens += 8
        manager.allocate_slots(a, 8)
        seen.append(window_ids(manager, "a"))
    # A query at p reads keys (p-8, p]: at 16 block 0-1 go (uncached: reused at once), at 24
    # blocks 2-3 go but keep their hash (the checkpoint at 16 holds tokens 9..15).
    assert seen == [
        (0, [0, 1]),
        (0, [0, 1, 2, 3]),
        (2, [2, 3, 0, 1]),
        (4, [0, 1, 4, 5]),
        (6, [4, 5, 0, 1]),
    ]
    assert sorted(sliding.checkpoints.values()) == [16, 32]
    hashed = sorted(b.block_id for b in sliding.block_pool.blocks if b.block_hash is not None)
    assert hashed == [2, 3, 4, 5]  # windows of 16 (blocks 2, 3) and 32 (blocks 6, 7)
    assert [sliding.block_pool.blocks[i].ref_cnt for i in (0, 1, 2, 3, 4, 5)] == [1, 1, 0, 0, 1, 1]
    # The full group keeps every block, as before.
    assert manager.get_block_ids("a") == list(range(10))
    manager.free(a)
    # Uncached blocks first (reused at once), cached checkpoint blocks at the tail, newest first.
    queue = sliding.block_pool.free_queue.block_ids()
    assert queue[:2] == [0, 1] and queue[-4:] == [3, 2, 5, 4]


def test_reuse_point_is_the_last_checkpoint_the_full_chain_covers():
    manager = make_manager(window=8, interval=16)
    a = make_request("a", range(40))
    prefill(manager, a)
    b = make_request("b", [*range(36), 90, 91, 92, 93, 94, 95, 96, 97, 98])
    hits, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 32
    full_ids, window_ids_ = hits.blocks.get_block_ids()
    assert full_ids == list(range(8))  # a's full blocks 0..7
    # The window before 32: blocks 6, 7 of a's sliding table (ids 4, 5); the null block before.
    assert window_ids_ == [-1] * 6 + [4, 5]
    reuse = hits.reuse
    assert (reuse.num_reused_tokens, reuse.num_lost_to_retention) == (32, 4)
    assert (reuse.num_lost_to_alignment, reuse.num_cold_tokens) == (0, 9)
    assert manager.allocate_slots(b, 13, hits) is not None
    assert window_ids(manager, "b") == (6, [4, 5, 6, 7, 8, 9])
    assert [manager.sliding.block_pool.blocks[i].ref_cnt for i in (4, 5)] == [2, 2]
    assert manager.stats.hits == 32 and manager.stats.lost_to_retention == 4


def test_the_record_makes_a_hit_not_the_presence_of_window_blocks():
    # Window 24 > interval 16: the windows of checkpoints 16 and 32 overlap and together hold
    # blocks 0..7, so the window before 28 is all there — but 28 is not on the grid.
    manager = make_manager(window=24, interval=16)
    prefill(manager, make_request("a", range(40)))
    present = [b.block_hash is not None for b in manager.sliding.block_pool.blocks[:8]]
    assert all(present)
    b = make_request("b", [*range(28), 99, 98, 97, 96, 95])
    hits, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 16
    assert hits.reuse.num_lost_to_retention == 12


def test_dense_retention_reuses_every_full_block():
    manager = make_manager(window=8, interval=None)
    prefill(manager, make_request("a", range(40)))
    b = make_request("b", [*range(30), 99, 98])
    _, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 28  # the chain's 7 blocks; tokens 28, 29 are alignment
    hits, _ = manager.get_computed_blocks(b)
    assert (hits.reuse.num_lost_to_alignment, hits.reuse.num_lost_to_retention) == (2, 0)


def test_interval_zero_keeps_only_the_prompt_end():
    manager = make_manager(window=8, interval=0)
    prefill(manager, make_request("a", range(22)))
    assert list(manager.sliding.checkpoints.values()) == [20]
    hits, num_hit = manager.get_computed_blocks(make_request("b", [*range(22), 5, 6]))
    assert num_hit == 20
    hits, num_hit = manager.get_computed_blocks(make_request("c", [*range(14), 77, 78]))
    assert num_hit == 0
    reuse = hits.reuse
    assert (reuse.num_lost_to_retention, reuse.num_lost_to_alignment) == (12, 2)
    assert reuse.num_cold_tokens == 2


def test_no_checkpoint_without_caching():
    manager = make_manager(caching=False)
    a = make_request("a", range(40))
    prefill(manager, a)
    assert manager.sliding.checkpoints == {}
    assert all(b.block_hash is None for b in manager.sliding.block_pool.blocks)
    hits, num_hit = manager.get_computed_blocks(make_request("b", range(40)))
    assert num_hit == 0 and hits.reuse.num_cold_tokens == 40


def test_evicted_checkpoint_blocks_count_as_eviction_not_retention():
    # A small sliding pool: a later long request takes a's checkpoint blocks for its window,
    # while the full group (40 blocks) still holds a's whole chain.
    manager = make_manager(window=8, interval=16, num_blocks=40, num_sliding_blocks=8)
    a = make_request("a", range(40))
    prefill(manager, a)
    manager.free(a)
    assert sorted(manager.sliding.checkpoints.values()) == [16, 32]
    other = make_request("o", range(1000, 1080))
    prefill(manager, other)
    manager.free(other)
    b = make_request("b", [*range(36), 90, 91])
    hits, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 0  # both checkpoints lost a block to `other`
    reuse = hits.reuse
    assert (reuse.num_lost_to_eviction, reuse.num_lost_to_retention) == (32, 4)
    assert reuse.num_cold_tokens == 2


def test_evicted_full_blocks_count_as_eviction():
    manager = make_manager(window=8, interval=None, num_blocks=12)
    a = make_request("a", range(24))
    prefill(manager, a)
    manager.free(a)
    filler = make_request("f", range(500, 540))  # needs 10 of the 12 full blocks
    prefill(manager, filler)
    manager.free(filler)
    b = make_request("b", [*range(24), 1, 2, 3])
    hits, num_hit = manager.get_computed_blocks(b)
    reuse = hits.reuse
    assert num_hit == reuse.num_reused_tokens
    assert reuse.num_lost_to_eviction > 0
    assert (
        reuse.num_reused_tokens
        + reuse.num_lost_to_retention
        + reuse.num_lost_to_alignment
        + reuse.num_lost_to_eviction
        + reuse.num_cold_tokens
    ) == 27
    assert reuse.num_cold_tokens == 3


def test_allocation_that_does_not_fit_the_sliding_pool_returns_none_and_changes_nothing():
    manager = make_manager(window=8, num_blocks=16, num_sliding_blocks=2)
    a = make_request("a", range(12))
    hits, _ = manager.get_computed_blocks(a)
    assert manager.allocate_slots(a, 12, hits) is None
    assert manager.block_pool.num_free_blocks == 16
    assert manager.sliding.block_pool.num_free_blocks == 2
    assert manager.allocate_slots(a, 8, hits) is not None


def test_memory_per_running_sequence_is_bounded_by_the_window_plus_a_chunk():
    window, chunk = 16, 8
    manager = make_manager(window=window, interval=None, num_blocks=80)
    a = make_request("a", range(200))
    hits, _ = manager.get_computed_blocks(a)
    manager.allocate_slots(a, chunk, hits)
    bound = -(-(window - 1 + chunk) // BLOCK) + 1
    most = 0
    while a.num_computed_tokens + chunk < a.num_tokens:
        a.num_computed_tokens += chunk
        assert manager.allocate_slots(a, chunk) is not None
        most = max(most, manager.sliding.num_held_blocks("a"))
    for token in range(10):  # decoding
        a.num_computed_tokens = a.num_tokens
        a.append_output_token(token, 0.0)
        assert manager.allocate_slots(a, 1) is not None
        most = max(most, manager.sliding.num_held_blocks("a"))
    assert len(manager.get_block_ids("a")) == 53  # the full group holds all 210 tokens
    assert most <= bound == 7


def test_checkpoints_are_evicted_least_recently_used_first():
    manager = make_manager(window=8, interval=0, num_blocks=32, num_sliding_blocks=8)
    pool = manager.sliding.block_pool
    a, c = make_request("a", range(12)), make_request("c", range(100, 112))
    for request in (a, c):
        prefill(manager, request, chunk=24)
        manager.free(request)
    # Prompt end 12: each keeps the window before it, blocks 1-2 (a: ids 1, 2; c: ids 3, 4).
    assert pool.free_queue.block_ids() == [0, 5, 6, 7, 2, 1, 4, 3]
    b = make_request("b", [*range(12), 50, 51])  # hits a's checkpoint: a's becomes the newest
    assert prefill(manager, b, chunk=24) == 12
    manager.free(b)
    assert pool.free_queue.block_ids() == [0, 5, 6, 7, 4, 3, 2, 1]
    prefill(manager, make_request("d", range(200, 224)), chunk=24)  # takes 6 blocks: 0 .. 3
    assert manager.get_window_block_ids("d") == (0, [0, 5, 6, 7, 4, 3])
    hits, num_hit = manager.get_computed_blocks(make_request("c2", [*range(100, 112), 60]))
    assert num_hit == 0 and hits.reuse.num_lost_to_eviction == 12
    hits, num_hit = manager.get_computed_blocks(make_request("a2", [*range(12), 61]))
    assert num_hit == 12 and hits.blocks.get_block_ids()[1] == [-1, 1, 2]


def test_junctions_handed_to_allocation_keep_the_window_there_token_exact():
    manager = tiny_kv_cache_manager(
        32, BLOCK, sliding_window=8, retention_interval=16, enable_partial_block_reuse=True
    )
    a = make_request("a", range(20))
    hits, _ = manager.get_computed_blocks(a)
    a.num_cached_tokens, a.reuse = 0, hits.reuse
    # The scheduler's junction at 10 (inside block 2): recorded once block 2 is full.
    assert manager.allocate_slots(a, 8, hits, junctions=[10]) is not None
    a.num_computed_tokens = 8
    assert manager.sliding.checkpoints == {}
    assert manager.allocate_slots(a, 12, junctions=[10]) is not None
    a.num_computed_tokens = 20
    assert sorted(manager.sliding.checkpoints.values()) == [10, 16]
    assert manager.sliding.num_junction_checkpoints == 1
    manager.new_step()  # a's blocks are computed: their slots can be copied
    b = make_request("b", [*range(10), 99, 98, 97])
    hits, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 10 and hits.reuse.source == "junction"
    assert hits.partial is not None and hits.partial.num_slots == 2
    assert hits.blocks.get_block_ids() == ([0, 1], [0, 1])
    assert manager.allocate_slots(b, 3, hits) is not None
    # Tokens 8, 9 of a's block 2, in each group, into b's fresh block 5.
    copies = [(c.group, c.src_block_id, c.dst_block_id, c.num_slots) for c in manager.take_copies()]
    assert copies == [("full", 2, 5, 2), ("sliding", 2, 5, 2)]


def test_without_the_junction_the_same_prompts_resume_on_the_grid_only():
    manager = tiny_kv_cache_manager(
        32, BLOCK, sliding_window=8, retention_interval=16, enable_partial_block_reuse=True
    )
    prefill(manager, make_request("a", range(20)))
    manager.new_step()
    hits, num_hit = manager.get_computed_blocks(make_request("b", [*range(10), 99, 98, 97]))
    assert num_hit == 0 and hits.reuse.num_lost_to_retention == 10
