"""The sliding-window KV cache group's manager (a SingleTypeKVCacheManager): per-request
windows of blocks, and window checkpoints.

A sliding layer's query at position p reads keys in (p - W, p], so a running request holds
only the blocks from `first_needed_block(start)` on (start: its first query this step); older
ones are released as the window moves, which bounds its memory by the window plus one prefill
chunk. Its block table keeps the pool's null block in the released places, so block index i
still covers tokens [i·B, (i+1)·B) as in the full-attention group, and both groups share the
chain hashes.

A window checkpoint at P (a multiple of B) is the window's blocks before P, kept cached
(hashed, ref-counted, evictable in LRU order like any block) plus a record, keyed by the chain
hash at P, that a checkpoint exists there. The retention policy decides the positions; a
released block that no checkpoint needs has no hash and goes back to the head of the free
queue, reused at once. The record, not the accidental presence of blocks, makes P a hit —
except under dense retention with token-exact reuse, which keeps every block of the window:
there every position inside a kept block is a checkpoint (RetentionPolicy.keeps_every_position),
found without a record, so a prompt resumes exactly where it leaves a cached one.

Breakpoints and junctions put checkpoints anywhere, not only on block boundaries. A checkpoint
at P inside block j is keyed by (hash of block j, P mod B), recorded once block j is full (its
hash exists); a later request that matches block j's first P mod B tokens resumes at P by
copying those slots of block j into a fresh block of its own (copy-on-write), in both groups.
On a boundary the key is (hash of block P/B - 1, B), and nothing is copied.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from inference.engine.kv.block_pool import KVCacheBlock
from inference.engine.kv.hashing import BlockHash, BlockHasher
from inference.engine.kv.retention import RetentionPolicy
from inference.engine.kv.single_type_kv_cache_manager import (
    AllocationPlan,
    GroupHit,
    PartialTail,
    PrefixMatch,
    SingleTypeKVCacheManager,
)
from inference.engine.request import Request

CheckpointKey = tuple[BlockHash, int]  # (hash of the block holding P - 1, P - that block's start)


class SlidingWindowManager(SingleTypeKVCacheManager):
    kind = "sliding"

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        window: int,
        policy: RetentionPolicy,
        enable_caching: bool,
        hasher: BlockHasher,
        max_checkpoints: int | None = None,
    ) -> None:
        super().__init__(num_blocks, block_size, enable_caching, hasher)
        self.window = window
        self.policy = policy
        # key at P → P, least recently recorded or hit first; bounded, and an entry whose
        # blocks were evicted stays (it tells a miss that it was an eviction). Pinned ones stay.
        self.checkpoints: OrderedDict[CheckpointKey, int] = OrderedDict()
        self.checkpoint_kinds: dict[CheckpointKey, str] = {}
        self.offsets: dict[BlockHash, set[int]] = {}  # block hash → offsets recorded in it
        self.pinned: dict[CheckpointKey, int] = {}  # key → pin count
        self.num_junction_checkpoints = 0
        self.max_checkpoints = max_checkpoints or max(1024, 4 * num_blocks)
        # request → block index below which its window's blocks are already hashed
        self.num_hashed: dict[str, int] = {}
        # request → checkpoints inside a block, recorded once that block is full (its hash is
        # the key): (position, kind)
        self.pending: dict[str, list[tuple[int, str]]] = {}
        # Checkpoints recorded since the KV tiers last took them (kv/tiers); None: no tiers.
        self.new_checkpoints: list[tuple[CheckpointKey, int, str]] | None = None
        # request → the end of the tokens its checkpoints were planned for
        self.recorded_upto: dict[str, int] = {}

    def first_needed_block(self, position: int) -> int:
        """The first block a query at `position` (or later) still reads."""
        return max(0, position - self.window + 1) // self.block_size

    # ---- lookup -------------------------------------------------------------------------

    def find_longest_cache_hit(
        self, request: Request, match: PrefixMatch, max_length: int
    ) -> GroupHit:
        """The largest recorded P ≤ max_length whose window blocks are all still cached.

        Within the full group's match: block i's checkpoints for i below the chain's end, and
        the ones inside the cached blocks that continue the chain (as far as each matches).
        """
        evicted = 0
        size = self.block_size
        every_position = self.policy.keeps_every_position
        num_chain = len(match.chain)
        children = [(block.block_hash, n) for block, n in match.children]
        for index in range((max_length - 1) // size, -1, -1):
            if index < num_chain:
                candidates = [(request.block_hashes[index], size)]
            elif index == num_chain:
                candidates = children
            else:
                continue
            best: GroupHit | None = None
            for block_hash, matching in candidates:
                limit = min(matching, max_length - index * size)
                recorded = self.offsets.get(block_hash, set())
                offsets = sorted(recorded, reverse=True)
                if every_position and limit > 0 and limit not in recorded:
                    offsets.insert(0, limit)  # where the match ends: the window is kept there
                for offset in offsets:
                    if offset > limit or (best and index * size + offset <= best.position):
                        continue
                    found = self._checkpoint_at(request, index, block_hash, offset)
                    if found is not None:
                        best = found
                        break
                    if offset in recorded:
                        evicted = max(evicted, index * size + offset)
            if best is not None:
                if best.key in self.checkpoints:
                    self.checkpoints.move_to_end(best.key)
                best.evicted_position = evicted
                return best
        return GroupHit(0, [], evicted_position=evicted)

    def _checkpoint_at(
        self, request: Request, index: int, block_hash: BlockHash, offset: int
    ) -> GroupHit | None:
        """The checkpoint (block_hash, offset) ending inside block `index`, if all its window
        blocks are cached (and, inside a block, computed before this step: it is copied)."""
        size = self.block_size
        position = index * size + offset
        key = (block_hash, offset)
        tokens = request.all_token_ids
        first = self.first_needed_block(position)
        blocks = [self.block_pool.null_block] * first
        for i in range(first, index):
            block = self.block_pool.get_cached_block(
                request.block_hashes[i], tuple(tokens[i * size : (i + 1) * size])
            )
            if block is None:
                return None
            blocks.append(block)
        last = self.block_pool.get_block_by_hash(block_hash)
        if last is None or last.token_ids[:offset] != tuple(tokens[index * size : position]):
            return None
        kind = self.checkpoint_kinds.get(key, "retention")
        if offset == size:
            return GroupHit(position, [*blocks, last], None, 0, kind, key)
        if not self.block_pool.is_ready(last):
            return None
        return GroupHit(position, blocks, last, 0, kind, key)

    # ---- allocation (plan, then commit) ---------------------------------------------------

    def plan(
        self, request: Request, num_computed: int, end: int, hits: list[KVCacheBlock]
    ) -> AllocationPlan:
        table = self.req_to_blocks.get(request.request_id)
        first = self.first_needed_block(num_computed)
        # Leading blocks out of the window now: the ones only this request holds come back.
        releasable = [block for block in (table or [])[:first] if not block.is_null]
        # Admission: the table starts as long as the reuse point (the hits, null-padded).
        num_table = len(table) if table is not None else num_computed // self.block_size
        num_new = max(-(-end // self.block_size) - num_table, 0)
        num_returned = sum(1 for block in releasable if block.ref_cnt == 1)
        # Hits that sit in the free queue stop being free once we take them.
        num_needed = num_new + self.block_pool.num_evictable(hits) - num_returned
        return AllocationPlan(num_new, num_needed)

    def allocate(
        self,
        request: Request,
        num_computed: int,
        end: int,
        hits: list[KVCacheBlock],
        plan: AllocationPlan,
        junctions: Sequence[int],
    ) -> list[KVCacheBlock]:
        rid = request.request_id
        table = self.req_to_blocks.get(rid)
        if table is None:  # admitted: the window before the reuse point is the hits
            null = self.block_pool.null_block
            table = [null] * (num_computed // self.block_size - len(hits)) + list(hits)
            self.block_pool.touch(hits)
            self.req_to_blocks[rid] = table
            self.num_hashed[rid] = len(table)
        records = self.enable_caching and request.replay_start is None  # a replay: approximate
        since = self.recorded_upto.get(rid, num_computed)
        if records and since < num_computed:
            # Accepted draft tokens (speculative decoding) were computed past the last step's
            # end: their checkpoints now, while their windows are still held.
            self._record_checkpoints(request, since, num_computed, junctions)
        self._release(table, self.first_needed_block(num_computed))
        new_blocks = self.block_pool.get_new_blocks(plan.num_new_blocks)
        table.extend(new_blocks)
        if records:
            end = min(end, request.num_tokens)  # never a draft's tokens: they may be rejected
            self._record_checkpoints(request, num_computed, end, junctions)
            self.recorded_upto[rid] = end
        return new_blocks

    def free(self, request: Request, tail: PartialTail | None) -> None:
        """Release every block, newest first; the ones no checkpoint holds are reused first.

        `tail`: the request's unfilled last block, cached in the full group; checkpoints still
        pending inside it are recorded against it now.
        """
        table = self.req_to_blocks.get(request.request_id, [])
        if tail is not None and self.enable_caching and request.replay_start is None:
            self._record_in_tail(request, table, *tail)
        table = self.req_to_blocks.pop(request.request_id, [])
        self.num_hashed.pop(request.request_id, None)
        self.pending.pop(request.request_id, None)
        self.recorded_upto.pop(request.request_id, None)
        held = [block for block in reversed(table) if not block.is_null]
        self.block_pool.free_blocks(held, uncached_first=True)

    def pin(self, blocks: list[KVCacheBlock], checkpoint_key: tuple | None) -> None:
        """Also keep the checkpoint record: it is never dropped from the bounded index."""
        super().pin(blocks, checkpoint_key)
        if checkpoint_key is not None:
            self.pinned[checkpoint_key] = self.pinned.get(checkpoint_key, 0) + 1

    def unpin(self, blocks: Sequence[KVCacheBlock], checkpoint_key: tuple | None) -> None:
        super().unpin(blocks, checkpoint_key)
        if checkpoint_key is not None:
            self.pinned[checkpoint_key] -= 1
            if not self.pinned[checkpoint_key]:
                del self.pinned[checkpoint_key]

    def window_block_ids(self, request_id: str) -> tuple[int, list[int]]:
        """(index of the first held block, the held blocks' ids from there on)."""
        table = self.req_to_blocks.get(request_id, [])
        first = next((i for i, block in enumerate(table) if not block.is_null), len(table))
        return first, [block.block_id for block in table[first:]]

    def num_held_blocks(self, request_id: str) -> int:
        return sum(not block.is_null for block in self.req_to_blocks.get(request_id, []))

    # ---- internals ------------------------------------------------------------------------

    def _release(self, table: list[KVCacheBlock], first_needed: int) -> None:
        released = []
        for index in range(min(first_needed, len(table))):
            if not table[index].is_null:
                released.append(table[index])
                table[index] = self.block_pool.null_block
        # Newest first, as `free` does: uncached blocks then sit at the queue's head in order.
        self.block_pool.free_blocks(released[::-1], uncached_first=True)

    def _record_checkpoints(
        self, request: Request, start: int, end: int, junctions: Sequence[int]
    ) -> None:
        """Hash the window before each checkpoint position reached this step and record it;
        one inside a block waits (pending) until that block is full and has its hash."""
        size = self.block_size
        rid = request.request_id
        table = self.req_to_blocks[rid]
        waiting = self.pending.setdefault(rid, [])
        for position, kind in self.policy.checkpoint_positions(request, start, end, junctions):
            last = position // size
            for index in range(max(self.first_needed_block(position), self.num_hashed[rid]), last):
                self._cache(request, table, index)
            self.num_hashed[rid] = max(self.num_hashed[rid], last)
            if position % size == 0:
                self._record((request.block_hashes[last - 1], size), position, kind)
            else:
                waiting.append((position, kind))
        pending = []
        for position, kind in waiting:
            index = position // size
            if (index + 1) * size <= end and index < len(request.block_hashes):
                self._cache(request, table, index)
                self._record((request.block_hashes[index], position % size), position, kind)
            else:
                pending.append((position, kind))
        self.pending[rid] = pending

    def _record_in_tail(
        self,
        request: Request,
        table: list[KVCacheBlock],
        index: int,
        block_hash: BlockHash,
        tokens: tuple,
    ) -> None:
        pending = [
            (p, kind)
            for p, kind in self.pending.get(request.request_id, [])
            if p // self.block_size == index
        ]
        block = table[index] if index < len(table) else self.block_pool.null_block
        if block.is_null or not (pending or self.policy.keeps_every_position):
            return
        parent = self.hasher.parent_hash(request, index)
        self.block_pool.cache_block(block, block_hash, tokens, parent)
        for position, kind in pending:
            if position - index * self.block_size <= len(tokens):
                self._record((block_hash, position % self.block_size), position, kind)

    def _cache(self, request: Request, table: list[KVCacheBlock], index: int) -> None:
        block = table[index]
        assert not block.is_null, "a checkpoint's window must still be held"
        size = self.block_size
        self.block_pool.cache_block(
            block,
            request.block_hashes[index],
            tuple(request.all_token_ids[index * size : (index + 1) * size]),
            self.hasher.parent_hash(request, index),
        )

    def record_checkpoint(self, key: CheckpointKey, position: int, kind: str) -> None:
        """Record a checkpoint whose window blocks were put in the pool from outside (a KV
        tier's load): as if this manager had kept it."""
        self._record(key, position, kind)

    def _record(self, key: CheckpointKey, position: int, kind: str) -> None:
        if self.new_checkpoints is not None:
            self.new_checkpoints.append((key, position, kind))
        if kind == "junction" and key not in self.checkpoints:
            self.num_junction_checkpoints += 1
        self.checkpoints[key] = position
        self.checkpoints.move_to_end(key)
        if kind != "retention" or key not in self.checkpoint_kinds:
            self.checkpoint_kinds[key] = kind
        self.offsets.setdefault(key[0], set()).add(key[1])
        while len(self.checkpoints) > self.max_checkpoints:
            oldest = next(iter(self.checkpoints))
            if oldest in self.pinned:
                self.checkpoints.move_to_end(oldest)
                continue
            self.checkpoints.popitem(last=False)
            self.checkpoint_kinds.pop(oldest, None)
            offsets = self.offsets.get(oldest[0], set())
            offsets.discard(oldest[1])
            if not offsets:
                self.offsets.pop(oldest[0], None)
