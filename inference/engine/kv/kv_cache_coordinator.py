"""KVCacheCoordinator: one manager per KV cache group, asked in turn (vLLM v1's coordinator).

The full-attention group anchors a lookup: its chain says how far a prompt matches the cache
(single_type_kv_cache_manager.PrefixMatch). Each other group (a sliding window) then finds the
longest point at or below that where it holds its own state, within the match; the full group
supplies the point they agree on. The hit is the longest prefix valid in every group: a point
inside a block needs each group's copy source, and when the full group cannot copy there (its
source is computed by this step) no window state is known at the block below without another
lookup, so the request resumes at 0. With only the full group, it rounds down to the block.

Allocation plans every group before committing any, so an allocation that one pool cannot
hold changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inference.engine.kv.block_pool import KVCacheBlock
from inference.engine.kv.partial_blocks import BlockCopy, PartialBlock
from inference.engine.kv.single_type_kv_cache_manager import (
    FullAttentionManager,
    GroupHit,
    PrefixMatch,
    SingleTypeKVCacheManager,
)
from inference.engine.request import Request


@dataclass(slots=True)
class LongestCacheHit:
    match: PrefixMatch  # the full group's, unnarrowed (the accounting reads it)
    hits: list[GroupHit]  # one per group, in the coordinator's order; all at the same position
    evicted_position: int  # the largest point at or above the hit whose state was evicted

    @property
    def position(self) -> int:
        return self.hits[0].position


class KVCacheCoordinator:
    def __init__(
        self, full: FullAttentionManager, others: Sequence[SingleTypeKVCacheManager] = ()
    ) -> None:
        self.full = full
        self.others = list(others)
        self.managers: list[SingleTypeKVCacheManager] = [full, *self.others]

    def new_step(self) -> None:
        for manager in self.managers:
            manager.new_step()

    def find_longest_cache_hit(self, request: Request, limit: int) -> LongestCacheHit:
        """The longest prefix of the (hashed) request, at most `limit` tokens, that every
        group can resume from."""
        match = self.full.match(request, limit)
        position, narrowed, others = match.num_reusable, match, []
        for manager in self.others:
            hit = manager.find_longest_cache_hit(request, narrowed, position)
            position = hit.position
            narrowed = narrowed.through(hit.source)
            others.append(hit)
        full = self.full.find_longest_cache_hit(request, narrowed, position)
        hits = [full, *others]
        if any(hit.position != full.position for hit in others):
            hits = [GroupHit(0, []) for _ in self.managers]
        evicted = max(hit.evicted_position for hit in hits)
        return LongestCacheHit(match, hits, max(evicted, hits[0].position))

    def allocate(
        self,
        request: Request,
        num_computed: int,
        end: int,
        hits: Sequence[list[KVCacheBlock]],
        junctions: Sequence[int],
    ) -> tuple[list[KVCacheBlock], ...] | None:
        """Every group's blocks for tokens [0, end), `num_computed` of them computed or hit
        (`hits`: each group's hit blocks); the new blocks per group, or None when a pool
        cannot hold them (then nothing changed)."""
        plans = []
        for manager, blocks in zip(self.managers, hits, strict=True):
            plan = manager.plan(request, num_computed, end, blocks)
            if not manager.can_allocate(plan):
                return None
            plans.append(plan)
        return tuple(
            manager.allocate(request, num_computed, end, blocks, plan, junctions)
            for manager, blocks, plan in zip(self.managers, hits, plans, strict=True)
        )

    def copy_partial(self, request: Request, partial: PartialBlock, index: int) -> list[BlockCopy]:
        """Copy-on-write: each group's source slots into the request's block at `index`."""
        copies = []
        for manager, source in zip(self.managers, partial.sources, strict=True):
            dst = manager.req_to_blocks[request.request_id][index]
            assert not dst.is_null, "the block after the reuse point is the request's own"
            copies.append(BlockCopy(manager.kind, source.block_id, dst.block_id, partial.num_slots))
        return copies

    def free(self, request: Request) -> None:
        """Release the request's blocks in every group; its unfilled last block is cached
        first (token-exact reuse), and checkpoints pending inside it are recorded there."""
        tail = self.full.cache_partial_tail(request) if self.full.enable_caching else None
        for manager in self.managers:
            manager.free(request, tail)
