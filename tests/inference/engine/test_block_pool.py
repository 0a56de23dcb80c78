"""Block pool: ref counts, LRU free order, the hash map and eviction."""

from inference.engine.kv.block_pool import BlockPool, FreeBlockQueue, KVCacheBlock
from inference.engine.kv.hashing import BlockHash


def h(n: int) -> BlockHash:
    return BlockHash(bytes([n]) * 32)


def test_free_queue_pops_in_order_and_removes_from_the_middle():
    blocks = [KVCacheBlock(i) for i in range(4)]
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[2])
    assert queue.block_ids() == [0, 1, 3]
    assert queue.popleft().block_id == 0
    queue.append(blocks[2])
    assert queue.block_ids() == [1, 3, 2]
    assert queue.num_free_blocks == 3


def test_new_blocks_come_from_the_head_with_one_reference():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(2)
    assert [b.block_id for b in blocks] == [0, 1]
    assert [b.ref_cnt for b in blocks] == [1, 1]
    assert pool.num_free_blocks == 2


def test_freed_blocks_join_the_tail_and_keep_their_hash_until_reused():
    pool = BlockPool(3)
    a, b = pool.get_new_blocks(2)
    pool.cache_block(a, h(1), (1, 2))
    pool.free_blocks([a, b])
    assert pool.free_queue.block_ids() == [2, 0, 1]
    assert pool.get_cached_block(h(1), (1, 2)) is a
    # Two allocations take block 2 and then block 0: block 0's hash is evicted.
    assert [blk.block_id for blk in pool.get_new_blocks(2)] == [2, 0]
    assert pool.get_cached_block(h(1), (1, 2)) is None
    assert pool.num_evictions == 1


def test_touch_takes_a_free_cached_block_out_of_the_free_queue():
    pool = BlockPool(3)
    (a,) = pool.get_new_blocks(1)
    pool.cache_block(a, h(7), (7,))
    pool.free_blocks([a])
    pool.touch([a])
    assert a.ref_cnt == 1
    assert 0 not in pool.free_queue.block_ids()
    pool.touch([a])
    pool.free_blocks([a])
    assert a.ref_cnt == 1 and pool.num_free_blocks == 2


def test_a_hit_compares_tokens_so_a_collision_is_a_miss():
    pool = BlockPool(2)
    (a,) = pool.get_new_blocks(1)
    pool.cache_block(a, h(3), (1, 2, 3))
    assert pool.get_cached_block(h(3), (1, 2, 4)) is None
    assert pool.get_cached_block(h(3), (1, 2, 3)) is a


def test_first_block_cached_under_a_hash_wins():
    pool = BlockPool(2)
    a, b = pool.get_new_blocks(2)
    pool.cache_block(a, h(5), (5,))
    pool.cache_block(b, h(5), (5,))
    assert pool.get_cached_block(h(5), (5,)) is a
    assert b.block_hash is None


def test_caching_disabled_registers_nothing():
    pool = BlockPool(2, enable_caching=False)
    (a,) = pool.get_new_blocks(1)
    pool.cache_block(a, h(1), (1,))
    assert pool.get_cached_block(h(1), (1,)) is None


def test_children_index_follows_caching_and_eviction():
    pool = BlockPool(3)
    a, b, c = pool.get_new_blocks(3)
    pool.cache_block(a, h(1), (1,), parent_hash=None)
    pool.cache_block(b, h(2), (2,), parent_hash=h(1))
    pool.cache_block(c, h(3), (3,), parent_hash=h(1))
    assert pool.cached_children(None) == [a]
    assert pool.cached_children(h(1)) == [b, c]
    pool.free_blocks([b, a, c])  # queue: b, a, c
    pool.get_new_blocks(1)  # evicts b
    assert pool.cached_children(h(1)) == [c]
    assert pool.was_evicted(h(2)) and not pool.was_evicted(h(3))
    (d,) = pool.get_new_blocks(1)  # evicts a
    pool.cache_block(d, h(2), (2,), parent_hash=h(1))  # cached again: no longer "evicted"
    assert not pool.was_evicted(h(2)) and pool.was_evicted(h(1))


def test_evicted_hashes_are_bounded_oldest_first():
    pool = BlockPool(2, max_evicted_hashes=2)
    for n in range(4):
        (block,) = pool.get_new_blocks(1)
        pool.cache_block(block, h(n), (n,))
        pool.free_blocks([block])
        pool.get_new_blocks(2)  # evicts it
        pool.free_blocks([pool.blocks[0], pool.blocks[1]])
    assert list(pool.evicted_hashes) == [h(2), h(3)]


def test_uncached_blocks_can_go_to_the_head_of_the_free_queue():
    pool = BlockPool(4)
    a, b, c = pool.get_new_blocks(3)
    pool.cache_block(a, h(1), (1,))
    pool.free_blocks([a, b, c], uncached_first=True)
    # b, c hold nothing cacheable: handed out first, before block 3 and the cached block 0.
    assert pool.free_queue.block_ids() == [2, 1, 3, 0]


def test_the_null_block_is_outside_the_pool_and_never_taken_or_freed():
    pool = BlockPool(3)
    null = pool.null_block
    assert null.is_null and null not in pool.blocks and pool.num_blocks == 3
    a = pool.get_new_blocks(1)[0]
    pool.free_blocks([a])  # a is free and cached-less: a hit on it would take free space
    hits = [null, null, a]
    assert pool.num_evictable(hits) == 1
    pool.touch(hits)
    assert (a.ref_cnt, null.ref_cnt, pool.num_free_blocks) == (1, 0, 2)
    pool.free_blocks(hits)
    assert (a.ref_cnt, null.ref_cnt) == (0, 0)
    assert pool.free_queue.block_ids() == [1, 2, 0]
