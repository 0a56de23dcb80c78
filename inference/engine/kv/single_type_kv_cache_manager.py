"""One KV cache group's manager (vLLM v1's SingleTypeKVCacheManager), and the full-attention one.

A KV cache group is the layers that keep one kind of attention state. Each group has its own
block pool and block tables; all of them index blocks alike (block i holds tokens
[i·B, (i+1)·B)) and key them by the request's chain hashes. A place in a table that holds no
block (a sliding window's released blocks) holds the pool's null block, so every group's table
for a request is as long as the full group's. The coordinator (kv_cache_coordinator) asks each
group in turn; a new kind of state is a new subclass, never another branch in the others.

`FullAttentionManager` holds every block of a request and anchors the prefix-cache lookup: its
chain (and, with token-exact reuse, the cached blocks continuing it: partial_blocks) says how far
a prompt matches the cache; the other groups look for their state within that match.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from inference.engine.kv.block_pool import BlockPool, KVCacheBlock
from inference.engine.kv.hashing import BlockHash, BlockHasher, hash_block_tokens
from inference.engine.kv.partial_blocks import matching_children, partial_source
from inference.engine.request import Request

# A request's unfilled last block, cached on free with a hash of its own: (index, hash, tokens).
PartialTail = tuple[int, BlockHash, tuple[int, ...]]


@dataclass(slots=True)
class PrefixMatch:
    """How far a request's tokens match the full group's cache: every group's hit lies within."""

    chain: list[KVCacheBlock]  # cached whole blocks that start the request's tokens
    # Token-exact reuse: cached blocks continuing the chain, with how many next tokens match.
    children: list[tuple[KVCacheBlock, int]]
    num_reusable: int  # the longest prefix the full group can resume from (H in prefix_reuse)

    def through(self, source: KVCacheBlock | None) -> PrefixMatch:
        """The match narrowed to the continuation keyed like `source` (a window group's copy
        source inside a block): the full group must copy from the same cached prompt."""
        if source is None:
            return self
        wanted = source.block_hash
        return replace(self, children=[(b, n) for b, n in self.children if b.block_hash == wanted])


@dataclass(slots=True)
class GroupHit:
    """One group's cache hit: the reuse point and the group's blocks before it."""

    position: int  # 0: no hit
    blocks: list[KVCacheBlock]  # one per whole block before `position` (null where not held)
    # `position` inside a block: the cached block whose first position mod B slots are copied.
    source: KVCacheBlock | None = None
    evicted_position: int = 0  # above `position`: the largest point whose state was evicted
    kind: str = "retention"  # what kept the state there (see RetentionPolicy.checkpoint_positions)
    key: tuple | None = None  # the window checkpoint resumed from (window groups)


@dataclass(slots=True)
class AllocationPlan:
    """What an allocation would take from a group's pool, checked before anything changes."""

    num_new_blocks: int
    num_needed_free: int  # free blocks it needs (hits in the free queue count; releases return)


class SingleTypeKVCacheManager(ABC):
    kind: ClassVar[str]  # the group's name in BlockCopy records and the runner's caches

    def __init__(
        self, num_blocks: int, block_size: int, enable_caching: bool, hasher: BlockHasher
    ) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.hasher = hasher
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.pinned_block_ids: dict[int, int] = {}  # block id → pin count

    @abstractmethod
    def find_longest_cache_hit(
        self, request: Request, match: PrefixMatch, max_length: int
    ) -> GroupHit:
        """The group's longest hit at or below `max_length`, within the full group's match."""

    @abstractmethod
    def plan(
        self, request: Request, num_computed: int, end: int, hits: list[KVCacheBlock]
    ) -> AllocationPlan:
        """What holding tokens [0, end) takes, `num_computed` of them computed (or hit)."""

    @abstractmethod
    def allocate(
        self,
        request: Request,
        num_computed: int,
        end: int,
        hits: list[KVCacheBlock],
        plan: AllocationPlan,
        junctions: Sequence[int],
    ) -> list[KVCacheBlock]:
        """Commit `plan` (checked by can_allocate); returns the new blocks."""

    @abstractmethod
    def free(self, request: Request, tail: PartialTail | None) -> None:
        """Release the request's blocks; `tail`: its unfilled last block, cached just now."""

    def can_allocate(self, plan: AllocationPlan) -> bool:
        return plan.num_needed_free <= self.block_pool.num_free_blocks

    def new_step(self) -> None:
        """A schedule begins: blocks cached from now on are computed by this step's forward."""
        self.block_pool.step += 1

    def get_block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.req_to_blocks.get(request_id, [])]

    def pin(self, blocks: list[KVCacheBlock], checkpoint_key: tuple | None) -> None:
        """Hold these blocks (a pinned head's) until unpin: they never reach the free queue."""
        self.block_pool.touch(blocks)
        for block in blocks:
            self.pinned_block_ids[block.block_id] = self.pinned_block_ids.get(block.block_id, 0) + 1

    def unpin(self, blocks: Sequence[KVCacheBlock], checkpoint_key: tuple | None) -> None:
        self.block_pool.free_blocks(list(reversed(blocks)))
        for block in blocks:
            count = self.pinned_block_ids[block.block_id] - 1
            if count:
                self.pinned_block_ids[block.block_id] = count
            else:
                del self.pinned_block_ids[block.block_id]


class FullAttentionManager(SingleTypeKVCacheManager):
    """Every block of every request; blocks are cached (registered) as soon as allocated for
    tokens that fill them, so a request admitted in the same step shares them."""

    kind = "full"

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool,
        hasher: BlockHasher,
        enable_partial_block_reuse: bool,
    ) -> None:
        super().__init__(num_blocks, block_size, enable_caching, hasher)
        # Copy partial blocks (token-exact reuse; CacheConfig.enable_partial_block_reuse).
        self.enable_partial_block_reuse = enable_partial_block_reuse
        self.num_cached_blocks: dict[str, int] = {}

    # ---- lookup -------------------------------------------------------------------------

    def match(self, request: Request, limit: int) -> PrefixMatch:
        """How far the request's (hashed) tokens match, resuming at most at `limit`."""
        size = self.block_size
        chain = self.live_chain(request)
        children = self.children(request, chain) if self.enable_partial_block_reuse else []
        if self.enable_partial_block_reuse:
            ready = [n for block, n in children if self.block_pool.is_ready(block)]
            num_reusable = min(len(chain) * size + max(ready, default=0), limit)
        else:
            num_reusable = min(len(chain), limit // size) * size
        return PrefixMatch(chain, children, num_reusable)

    def find_longest_cache_hit(
        self, request: Request, match: PrefixMatch, max_length: int
    ) -> GroupHit:
        """The chain up to `max_length`; inside a block, its first slots are copied from a
        source computed before this step, else the hit rounds down to the block."""
        size = self.block_size
        position, source = max_length, None
        if position % size:
            source = partial_source(self.block_pool, match.chain, match.children, position, size)
            if source is None:
                position = position // size * size
        return GroupHit(position, match.chain[: position // size], source)

    def live_chain(self, request: Request) -> list[KVCacheBlock]:
        """Cached blocks that start the request's tokens, as far as they go."""
        tokens = request.all_token_ids
        hits: list[KVCacheBlock] = []
        for index, block_hash in enumerate(request.block_hashes):
            start = index * self.block_size
            block = self.block_pool.get_cached_block(
                block_hash, tuple(tokens[start : start + self.block_size])
            )
            if block is None:
                break
            hits.append(block)
        return hits

    def children(
        self, request: Request, chain: list[KVCacheBlock]
    ) -> list[tuple[KVCacheBlock, int]]:
        """Cached blocks continuing the chain, with how many of the next tokens they match."""
        start = len(chain) * self.block_size
        parent = chain[-1].block_hash if chain else self.hasher.parent_hash(request, 0)
        tail = request.all_token_ids[start : start + self.block_size]
        return matching_children(self.block_pool, parent, tail)

    # ---- allocation ---------------------------------------------------------------------

    def plan(
        self, request: Request, num_computed: int, end: int, hits: list[KVCacheBlock]
    ) -> AllocationPlan:
        held = self.req_to_blocks.get(request.request_id, [])
        num_new_blocks = -(-end // self.block_size) - len(held) - len(hits)
        # Hits that sit in the free queue stop being free once we take them.
        return AllocationPlan(num_new_blocks, num_new_blocks + self.block_pool.num_evictable(hits))

    def allocate(
        self,
        request: Request,
        num_computed: int,
        end: int,
        hits: list[KVCacheBlock],
        plan: AllocationPlan,
        junctions: Sequence[int],
    ) -> list[KVCacheBlock]:
        held = self.req_to_blocks.setdefault(request.request_id, [])
        self.block_pool.touch(hits)
        held.extend(hits)
        new_blocks = self.block_pool.get_new_blocks(max(plan.num_new_blocks, 0))
        held.extend(new_blocks)
        if self.enable_caching:
            self._cache_full_blocks(request, end)
        return new_blocks

    def _cache_full_blocks(self, request: Request, num_tokens_after_step: int) -> None:
        """Register the blocks that will be full once this step has run."""
        num_full = min(num_tokens_after_step, request.num_tokens) // self.block_size
        first = self.num_cached_blocks.get(request.request_id, 0)
        if num_full <= first:
            return
        self.hasher.update(request)
        blocks = self.req_to_blocks[request.request_id]
        tokens = request.all_token_ids
        for index in range(first, num_full):
            start = index * self.block_size
            self.block_pool.cache_block(
                blocks[index],
                request.block_hashes[index],
                tuple(tokens[start : start + self.block_size]),
                self.hasher.parent_hash(request, index),
            )
        self.num_cached_blocks[request.request_id] = num_full

    # ---- release ------------------------------------------------------------------------

    def cache_partial_tail(self, request: Request) -> PartialTail | None:
        """Cache the computed part of the request's last, unfilled block under a hash of its
        own (never a full block's), so a later prompt that matches it copies it (token-exact
        reuse of a whole earlier prompt; a junction or breakpoint in that block)."""
        size = self.block_size
        index, num_slots = divmod(request.num_computed_tokens, size)
        blocks = self.req_to_blocks.get(request.request_id, [])
        if not self.enable_partial_block_reuse or not num_slots or index >= len(blocks):
            return None
        self.hasher.update(request)
        tokens = tuple(request.all_token_ids[index * size : request.num_computed_tokens])
        parent = request.block_hashes[index - 1] if index else None
        block_hash = hash_block_tokens(
            parent, tokens, self.hasher.chain_extra(request) + b"\x1fpartial"
        )
        self.block_pool.cache_block(
            blocks[index], block_hash, tokens, self.hasher.parent_hash(request, index)
        )
        return index, block_hash, tokens

    def free(self, request: Request, tail: PartialTail | None) -> None:
        """Release a request's blocks, tail first, so a shared head outlives the tails."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        self.block_pool.free_blocks(list(reversed(blocks)))

    def forget_uncomputed(self, request: Request) -> None:
        """Unregister the request's blocks from its first uncomputed token on: they were
        registered when allocated, and the step that was to write their K/V failed."""
        first = request.num_computed_tokens // self.block_size
        for block in self.req_to_blocks.get(request.request_id, [])[first:]:
            self.block_pool.uncache(block)
        self.num_cached_blocks[request.request_id] = min(
            self.num_cached_blocks.get(request.request_id, 0), first
        )
