"""The KV block pool: ref-counted blocks, an LRU free queue, and the prefix-cache map.

A block with ref_cnt 0 sits in the free queue but keeps its hash (and contents) until it is
handed out again: that is what makes it a cache hit later. Blocks are evicted from the head
of the free queue (least recently freed first). Cached blocks are also indexed by their chain
parent (to find which cached blocks continue a prefix: partial-block matches, junctions), and
the hashes of evicted blocks are remembered, boundedly, so a miss can say it was an eviction.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from inference.engine.kv.hashing import BlockHash


@dataclass(eq=False, slots=True)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    # The tokens behind the hash: a hit compares them, so a collision cannot reuse wrong state.
    token_ids: tuple[int, ...] | None = None
    parent_hash: BlockHash | None = None  # the chain hash before this block (None: first block)
    # The engine step that computes it (BlockPool.step when cached): a block cached in the
    # current step is written by this step's forward, so it can be shared (attention writes
    # before it reads) but not copied from (copies run before the forward).
    cached_step: int = -1
    prev_free: KVCacheBlock | None = None
    next_free: KVCacheBlock | None = None
    # The pool's placeholder for a place in a block table that holds no block (a sliding
    # window's released blocks): never handed out, never freed, never cached.
    is_null: bool = False

    def __repr__(self) -> str:
        if self.is_null:
            return "KVCacheBlock(null)"
        cached = self.block_hash is not None
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, cached={cached})"


class FreeBlockQueue:
    """Doubly linked list of free blocks; O(1) popleft, append and removal from the middle."""

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        assert block is not None and block is not self._tail, "free queue is empty"
        self.remove(block)
        return block

    def appendleft(self, block: KVCacheBlock) -> None:
        first = self._head.next_free
        assert first is not None
        self._head.next_free = block
        block.prev_free = self._head
        block.next_free = first
        first.prev_free = block
        self.num_free_blocks += 1

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def remove(self, block: KVCacheBlock) -> None:
        assert block.prev_free is not None and block.next_free is not None, "block is not free"
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def block_ids(self) -> list[int]:
        ids = []
        block = self._head.next_free
        while block is not None and block is not self._tail:
            ids.append(block.block_id)
            block = block.next_free
        return ids


class BlockPool:
    def __init__(
        self, num_blocks: int, enable_caching: bool = True, max_evicted_hashes: int | None = None
    ) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        # Outside `blocks`: the pool's block ids and capacity are the same with or without it.
        self.null_block = KVCacheBlock(-1, is_null=True)
        self.hash_to_block: dict[BlockHash, KVCacheBlock] = {}
        # parent chain hash (None: the root) → the cached blocks that continue it
        self.children: dict[BlockHash | None, dict[BlockHash, KVCacheBlock]] = {}
        # Hashes evicted and not cached again since, oldest first; bounded so it cannot grow
        # without limit on a long-running server.
        self.evicted_hashes: OrderedDict[BlockHash, None] = OrderedDict()
        self.max_evicted_hashes = max_evicted_hashes or max(1024, 4 * num_blocks)
        self.num_evictions = 0
        self.step = 0  # advanced by the cache manager once per schedule

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_cached_block(
        self, block_hash: BlockHash, token_ids: tuple[int, ...]
    ) -> KVCacheBlock | None:
        block = self.hash_to_block.get(block_hash)
        if block is None or block.token_ids != token_ids:
            return None
        return block

    def cache_block(
        self,
        block: KVCacheBlock,
        block_hash: BlockHash,
        token_ids: tuple[int, ...],
        parent_hash: BlockHash | None = None,
    ) -> None:
        """Register a computed full block; an existing entry for the same hash is kept."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self.hash_to_block:
            return
        block.block_hash = block_hash
        block.token_ids = token_ids
        block.parent_hash = parent_hash
        block.cached_step = self.step
        self.hash_to_block[block_hash] = block
        self.children.setdefault(parent_hash, {})[block_hash] = block
        self.evicted_hashes.pop(block_hash, None)

    def cached_children(self, parent_hash: BlockHash | None) -> list[KVCacheBlock]:
        """The cached blocks whose chain continues `parent_hash` (None: first blocks)."""
        return list(self.children.get(parent_hash, {}).values())

    def get_block_by_hash(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.hash_to_block.get(block_hash)

    def is_ready(self, block: KVCacheBlock) -> bool:
        """Computed by an earlier step, so its slots can be copied now."""
        return block.cached_step < self.step

    def was_evicted(self, block_hash: BlockHash) -> bool:
        return block_hash in self.evicted_hashes

    @property
    def num_cached_blocks(self) -> int:
        return len(self.hash_to_block)

    def num_evictable(self, blocks: list[KVCacheBlock]) -> int:
        """How many of these cache hits sit in the free queue: taking them uses free space."""
        return sum(1 for block in blocks if block.ref_cnt == 0 and not block.is_null)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        assert num_blocks <= self.num_free_blocks, "caller must check num_free_blocks"
        blocks = []
        for _ in range(num_blocks):
            block = self.free_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Take a reference on cache-hit blocks, pulling free ones out of the free queue."""
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: list[KVCacheBlock], uncached_first: bool = False) -> None:
        """Drop a reference; blocks reaching zero join the free queue in the given order.

        With `uncached_first`, a block that holds no cached state goes to the head of the
        queue instead: nothing can hit it, so it is the first to hand out again.
        """
        for block in ordered_blocks:
            if block.is_null:
                continue
            assert block.ref_cnt > 0, f"double free of {block}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if uncached_first and block.block_hash is None:
                    self.free_queue.appendleft(block)
                else:
                    self.free_queue.append(block)

    def uncache(self, block: KVCacheBlock) -> None:
        """Unregister a block whose K/V was never written (the step that was to compute it
        failed), so nothing hits it; not counted as an eviction."""
        self._evict(block, lost=False)

    def _evict(self, block: KVCacheBlock, lost: bool = True) -> None:
        if block.block_hash is None:
            return
        if self.hash_to_block.get(block.block_hash) is block:
            del self.hash_to_block[block.block_hash]
            siblings = self.children.get(block.parent_hash, {})
            siblings.pop(block.block_hash, None)
            if not siblings:
                self.children.pop(block.parent_hash, None)
            if lost:
                self.evicted_hashes[block.block_hash] = None
                if len(self.evicted_hashes) > self.max_evicted_hashes:
                    self.evicted_hashes.popitem(last=False)
                self.num_evictions += 1
        block.block_hash = None
        block.token_ids = None
        block.parent_hash = None
