"""The sliding-window KV group: per-request windows of blocks, and window checkpoints.

A sliding layer's query at position p reads keys in (p - W, p], so a running request holds
only the blocks from `first_needed_block(start)` on (start: its first query this step); older
ones are released as the window moves, which bounds its memory by the window plus one prefill
chunk. Its block table keeps None in the released places, so block index i still covers
tokens [i·B, (i+1)·B) as in the full-attention group, and both groups share the chain hashes.

A window checkpoint at P (a multiple of B) is the window's blocks before P, kept cached
(hashed, ref-counted, evictable in LRU order like any block) plus a record, keyed by the chain
hash at P, that a checkpoint exists there. The retention policy decides the positions; a
released block that no checkpoint needs has no hash and goes back to the head of the free
queue, reused at once. The record, not the accidental presence of blocks, makes P a hit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from inference.engine.block_pool import BlockPool, KVCacheBlock
from inference.engine.hashing import BlockHash
from inference.engine.request import Request
from inference.engine.retention import RetentionPolicy


@dataclass(slots=True)
class CheckpointLookup:
    position: int  # the reuse point: 0 when no checkpoint was found
    blocks: list[KVCacheBlock]  # the window's blocks before it
    evicted_position: int  # the largest position above it whose checkpoint was evicted, else 0


@dataclass(slots=True)
class WindowPlan:
    """What an allocation would do to a request's window, checked before anything changes."""

    num_release: int  # leading blocks out of the window now
    num_new_blocks: int
    num_needed_free: int  # free blocks it needs, counting the ones the release returns


class SlidingWindowManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        window: int,
        policy: RetentionPolicy,
        enable_caching: bool,
        parent_hash: Callable[[Request, int], BlockHash],
        max_checkpoints: int | None = None,
    ) -> None:
        self.block_size = block_size
        self.parent_hash = parent_hash  # a block's key in the children index (as the full group)
        self.window = window
        self.policy = policy
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock | None]] = {}
        # chain hash at P → P, least recently recorded or hit first; bounded, and an entry
        # whose blocks were evicted stays (it tells a miss that it was an eviction).
        self.checkpoints: OrderedDict[BlockHash, int] = OrderedDict()
        self.max_checkpoints = max_checkpoints or max(1024, 4 * num_blocks)
        # request → block index below which its window's blocks are already hashed
        self.num_hashed: dict[str, int] = {}

    def first_needed_block(self, position: int) -> int:
        """The first block a query at `position` (or later) still reads."""
        return max(0, position - self.window + 1) // self.block_size

    # ---- lookup -------------------------------------------------------------------------

    def find_checkpoint(self, request: Request, max_position: int) -> CheckpointLookup:
        """The largest recorded P ≤ max_position whose window blocks are all still cached."""
        evicted = 0
        size = self.block_size
        tokens = request.all_token_ids
        for position in range(max_position // size * size, 0, -size):
            block_hash = request.block_hashes[position // size - 1]
            if block_hash not in self.checkpoints:
                continue
            blocks = []
            for index in range(self.first_needed_block(position), position // size):
                block = self.block_pool.get_cached_block(
                    request.block_hashes[index], tuple(tokens[index * size : (index + 1) * size])
                )
                if block is None:
                    break
                blocks.append(block)
            else:
                self.checkpoints.move_to_end(block_hash)
                return CheckpointLookup(position, blocks, evicted)
            evicted = max(evicted, position)
        return CheckpointLookup(0, [], evicted)

    # ---- allocation (plan, then commit) ---------------------------------------------------

    def plan(
        self, request: Request, num_computed: int, end: int, hits: list[KVCacheBlock]
    ) -> WindowPlan:
        table = self.req_to_blocks.get(request.request_id)
        first = self.first_needed_block(num_computed)
        releasable = [block for block in (table or [])[:first] if block is not None]
        # Admission: the table starts as long as the reuse point (None, then the hits).
        num_table = len(table) if table is not None else num_computed // self.block_size
        num_new = max(-(-end // self.block_size) - num_table, 0)
        num_returned = sum(1 for block in releasable if block.ref_cnt == 1)
        # Hits that sit in the free queue stop being free once we take them.
        num_evictable_hits = sum(1 for block in hits if block.ref_cnt == 0)
        return WindowPlan(len(releasable), num_new, num_new + num_evictable_hits - num_returned)

    def can_allocate(self, plan: WindowPlan) -> bool:
        return plan.num_needed_free <= self.block_pool.num_free_blocks

    def allocate(
        self,
        request: Request,
        num_computed: int,
        end: int,
        hits: list[KVCacheBlock],
        plan: WindowPlan,
    ) -> None:
        rid = request.request_id
        table = self.req_to_blocks.get(rid)
        if table is None:  # admitted: the window before the reuse point is the hits
            table = [None] * (num_computed // self.block_size - len(hits)) + list(hits)
            self.block_pool.touch(hits)
            self.req_to_blocks[rid] = table
            self.num_hashed[rid] = len(table)
        self._release(table, self.first_needed_block(num_computed))
        table.extend(self.block_pool.get_new_blocks(plan.num_new_blocks))
        if self.enable_caching:
            self._record_checkpoints(request, num_computed, min(end, request.num_tokens))

    def free(self, request: Request) -> None:
        """Release every block, newest first; the ones no checkpoint holds are reused first."""
        table = self.req_to_blocks.pop(request.request_id, [])
        self.num_hashed.pop(request.request_id, None)
        held = [block for block in reversed(table) if block is not None]
        self.block_pool.free_blocks(held, uncached_first=True)

    def window_block_ids(self, request_id: str) -> tuple[int, list[int]]:
        """(index of the first held block, the held blocks' ids from there on)."""
        table = self.req_to_blocks.get(request_id, [])
        first = next((i for i, block in enumerate(table) if block is not None), len(table))
        return first, [block.block_id for block in table[first:]]  # type: ignore[union-attr]

    def num_held_blocks(self, request_id: str) -> int:
        return sum(block is not None for block in self.req_to_blocks.get(request_id, []))

    # ---- internals ------------------------------------------------------------------------

    def _release(self, table: list[KVCacheBlock | None], first_needed: int) -> None:
        released = []
        for index in range(min(first_needed, len(table))):
            if table[index] is not None:
                released.append(table[index])
                table[index] = None
        # Newest first, as `free` does: uncached blocks then sit at the queue's head in order.
        self.block_pool.free_blocks(released[::-1], uncached_first=True)

    def _record_checkpoints(self, request: Request, start: int, end: int) -> None:
        """Hash the window before each policy position reached this step, and record it."""
        size = self.block_size
        rid = request.request_id
        table = self.req_to_blocks[rid]
        tokens = request.all_token_ids
        for position in self.policy.checkpoint_positions(request, start, end):
            last = position // size
            for index in range(max(self.first_needed_block(position), self.num_hashed[rid]), last):
                block = table[index]
                assert block is not None, "a checkpoint's window must still be held"
                self.block_pool.cache_block(
                    block,
                    request.block_hashes[index],
                    tuple(tokens[index * size : (index + 1) * size]),
                    self.parent_hash(request, index),
                )
            self.num_hashed[rid] = max(self.num_hashed[rid], last)
            self.checkpoints[request.block_hashes[last - 1]] = position
            self.checkpoints.move_to_end(request.block_hashes[last - 1])
            if len(self.checkpoints) > self.max_checkpoints:
                self.checkpoints.popitem(last=False)
