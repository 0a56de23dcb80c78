"""Prefix caching on tiny configs: exact block ids, hit counts, ref counts, eviction order."""

from inference.engine.kv.kv_cache_manager import KVCacheManager
from inference.engine.request import Request
from inference.engine.sampling_params import SamplingParams
from tests.inference.engine.helpers import tiny_kv_cache_manager

BLOCK = 4


def make_manager(num_blocks: int = 10, caching: bool = True) -> KVCacheManager:
    return tiny_kv_cache_manager(num_blocks, BLOCK, enable_prefix_caching=caching)


def make_request(rid: str, tokens: list[int], salt: str | None = None) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4, cache_salt=salt))


def admit(manager: KVCacheManager, request: Request) -> int:
    """What the scheduler does for a waiting request: look up, allocate, mark computed."""
    hits, num_hit_tokens = manager.get_computed_blocks(request)
    new = manager.allocate_slots(request, request.num_tokens - num_hit_tokens, hits)
    assert new is not None
    request.num_computed_tokens = request.num_tokens
    return num_hit_tokens


def test_first_request_misses_and_caches_its_full_blocks():
    manager = make_manager()
    r = make_request("a", list(range(10)))  # 2 full blocks + 2 tokens
    assert admit(manager, r) == 0
    assert manager.get_block_ids("a") == [0, 1, 2]
    assert len(manager.block_pool.hash_to_block) == 2
    assert manager.stats.queries == 10 and manager.stats.hits == 0


def test_shared_prefix_reuses_blocks_and_counts_references():
    manager = make_manager()
    admit(manager, make_request("a", list(range(10))))
    b = make_request("b", [*range(8), 99, 98, 97])
    assert admit(manager, b) == 8
    assert manager.get_block_ids("b") == [0, 1, 3]
    blocks = manager.block_pool.blocks
    assert [blocks[i].ref_cnt for i in (0, 1, 2, 3)] == [2, 2, 1, 1]
    assert manager.stats.hits == 8 and manager.stats.queries == 21


def test_whole_prompt_cached_still_recomputes_the_last_block():
    manager = make_manager()
    admit(manager, make_request("a", list(range(8))))
    b = make_request("b", list(range(8)))
    # (8 - 1) // 4 = 1 block: the last token must be computed for its logits.
    assert admit(manager, b) == 4
    assert manager.get_block_ids("b") == [0, 2]


def test_divergence_inside_a_block_reuses_only_whole_blocks():
    manager = make_manager()
    admit(manager, make_request("a", list(range(12))))
    b = make_request("b", [0, 1, 2, 3, 4, 5, 50, 51, 52, 53])
    assert admit(manager, b) == 4


def test_cache_salt_keeps_tenants_apart():
    manager = make_manager()
    admit(manager, make_request("a", list(range(9)), salt="tenant-1"))
    assert admit(manager, make_request("b", list(range(9)), salt="tenant-2")) == 0
    assert admit(manager, make_request("c", list(range(9)), salt="tenant-1")) == 8


def test_free_releases_tail_first_so_the_head_is_evicted_last():
    manager = make_manager(num_blocks=8)
    a = make_request("a", list(range(12)))
    admit(manager, a)  # blocks 0, 1, 2
    filler = make_request("filler", list(range(200, 208)))
    admit(manager, filler)  # blocks 3, 4 stay held
    manager.free(a)
    # Free queue: never-used 5, 6, 7, then a's blocks tail first: 2, 1, 0.
    assert manager.block_pool.free_queue.block_ids() == [5, 6, 7, 2, 1, 0]
    # A 16-token request needs 4 new blocks: 5, 6, 7 and then evicts a's last block (2).
    c = make_request("c", list(range(100, 116)))
    admit(manager, c)
    assert manager.get_block_ids("c") == [5, 6, 7, 2]
    manager.free(filler)
    d = make_request("d", list(range(13)))
    assert admit(manager, d) == 8  # blocks 0 and 1 survived
    assert manager.get_block_ids("d") == [0, 1, 4, 3]


def test_allocation_that_does_not_fit_returns_none_and_changes_nothing():
    manager = make_manager(num_blocks=3)
    a = make_request("a", list(range(12)))
    hits, _ = manager.get_computed_blocks(a)
    assert manager.allocate_slots(a, 16, hits) is None
    assert manager.block_pool.num_free_blocks == 3
    assert manager.allocate_slots(a, 12, hits) is not None
    assert manager.block_pool.num_free_blocks == 0


def test_hits_in_the_free_queue_are_not_counted_as_free_space():
    manager = make_manager(num_blocks=3)
    a = make_request("a", list(range(8)))
    admit(manager, a)
    manager.free(a)  # blocks 0, 1 cached, all 3 free
    b = make_request("b", [*range(8), 1, 2, 3, 4, 5])  # hits 2 blocks, needs 2 more
    hits, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 8
    assert manager.allocate_slots(b, 5, hits) is None
    assert [blk.ref_cnt for blk in manager.block_pool.blocks] == [0, 0, 0]


def test_decode_tokens_fill_and_cache_blocks_as_they_complete():
    manager = make_manager()
    a = make_request("a", list(range(6)))
    admit(manager, a)
    for token in (6, 7):
        a.append_output_token(token, 0.0)
        assert manager.allocate_slots(a, 1) is not None
        a.num_computed_tokens += 1
    assert len(manager.block_pool.hash_to_block) == 2  # tokens 0..7 now fill two blocks
    b = make_request("b", list(range(9)))
    assert admit(manager, b) == 8


def test_caching_off_never_hits():
    manager = make_manager(caching=False)
    admit(manager, make_request("a", list(range(12))))
    assert admit(manager, make_request("b", list(range(12)))) == 0
    assert manager.block_pool.hash_to_block == {}


def test_make_stats_snapshots_usage_and_prefix_counters():
    manager = make_manager()
    admit(manager, make_request("a", list(range(10))))
    admit(manager, make_request("b", [*range(8), 99, 98, 97]))
    snapshot = manager.make_stats()
    assert snapshot.prefix_cache_queries == 21 and snapshot.prefix_cache_hits == 8
    assert snapshot.num_cold_tokens == 13
    assert snapshot.usage == 4 / 10  # blocks 0..3 held
    assert snapshot.num_checkpoints == 0 and snapshot.num_checkpoint_blocks == 0
    admit(manager, make_request("c", list(range(10))))
    # A snapshot is a copy: later lookups change the next one, not this one.
    assert snapshot.prefix_cache_queries == 21
    assert manager.make_stats().prefix_cache_queries == 31
