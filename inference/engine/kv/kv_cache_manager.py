"""KVCacheManager: the scheduler's side of the KV cache — lookups, allocation, accounting.

The scheduler talks to it through `KVCacheBlocks` (blocks per KV cache group), the lookup's
result (`PrefixCacheHit`) and plain counts; an allocation that cannot be satisfied returns None
and the scheduler decides what to do (preempt or wait). The groups themselves are managed by
one manager each under the coordinator (kv_cache_coordinator): the full-attention group, and on
a model with sliding-window layers the sliding group (sliding_window_manager). Both use the same
chain hash per block index. A model without sliding layers has only the full group.

Reuse is token-exact: when the match ends inside a block (a cached block continues the chain
and its first m tokens match), the request gets a fresh block and the runner copies those m
slots into it before the step's forward (copy-on-write), in every group. Copies are handed to
the scheduler as `BlockCopy` records, drained once per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inference.engine.kv.block_pool import BlockPool, KVCacheBlock
from inference.engine.kv.hashing import BlockHasher
from inference.engine.kv.kv_cache_coordinator import KVCacheCoordinator, LongestCacheHit
from inference.engine.kv.partial_blocks import BlockCopy, PartialBlock
from inference.engine.kv.prefix_reuse import PrefixReuse
from inference.engine.kv.retention import RetentionPolicy
from inference.engine.kv.single_type_kv_cache_manager import FullAttentionManager, GroupHit
from inference.engine.kv.sliding_window_manager import SlidingWindowManager
from inference.engine.metrics import KVCacheStats
from inference.engine.request import Request

if TYPE_CHECKING:  # config imports kv/ (retention): a type here only
    from inference.engine.config import CacheConfig


@dataclass(frozen=True, slots=True)
class BoundedReplay:
    """DeepSeek's bounded replay (approximate, off by default): a prefix whose window state was
    not kept resumes `window` tokens early, at a multiple of `alignment` (the model's largest
    compression rate, so no compressor window is cut)."""

    window: int
    alignment: int


@dataclass(slots=True)
class KVCacheBlocks:
    """Blocks per KV cache group, in the coordinator's order (full attention first); a group's
    places that hold no block hold its pool's null block."""

    blocks: tuple[list[KVCacheBlock], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([block.block_id for block in group] for group in self.blocks)


@dataclass(slots=True)
class PrefixCacheHit:
    """What get_computed_blocks found: the blocks to resume from, what allocating them needs,
    and the lookup's accounting."""

    blocks: KVCacheBlocks
    partial: PartialBlock | None = None  # the reuse point lies inside a block: copy its slots
    reuse: PrefixReuse | None = None  # where the prompt's tokens went (admission only)
    junction: int = 0  # where the prompt leaves the cached range, past the reuse point (0: no)
    checkpoint_key: tuple | None = None  # the window checkpoint resumed from (hybrid models)


@dataclass(slots=True)
class PrefixCacheStats:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # prompt tokens found
    lost_to_retention: int = 0
    lost_to_alignment: int = 0
    lost_to_eviction: int = 0
    cold: int = 0

    def add(self, reuse: PrefixReuse) -> None:
        self.queries += reuse.num_prompt_tokens
        self.hits += reuse.num_reused_tokens
        self.lost_to_retention += reuse.num_lost_to_retention
        self.lost_to_alignment += reuse.num_lost_to_alignment
        self.lost_to_eviction += reuse.num_lost_to_eviction
        self.cold += reuse.num_cold_tokens


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    """What the KV cache is built for that no setting chooses: the loaded model and the memory
    budget decide it (core/engine_builder.py)."""

    num_blocks: int  # the full-attention group's pool
    model_fingerprint: str  # part of every block hash: blocks of another model never match
    sliding_window: int | None = None  # the sliding layers' window; None: no sliding group
    num_sliding_blocks: int | None = None  # the sliding group's pool; None: num_blocks
    bounded_replay: BoundedReplay | None = None  # None: off, or the model cannot replay


class KVCacheManager:
    def __init__(self, cache: CacheConfig, spec: KVCacheSpec) -> None:
        self.block_size = cache.block_size
        self.enable_prefix_caching = cache.enable_prefix_caching
        self.hasher = BlockHasher(cache.block_size, spec.model_fingerprint)
        full = FullAttentionManager(
            spec.num_blocks,
            cache.block_size,
            cache.enable_prefix_caching,
            self.hasher,
            cache.enable_partial_block_reuse,
        )
        windows = []
        if spec.sliding_window is not None:
            policy = RetentionPolicy(
                cache.retention_interval, cache.block_size, cache.enable_partial_block_reuse
            )
            windows.append(
                SlidingWindowManager(
                    spec.num_sliding_blocks or spec.num_blocks,
                    cache.block_size,
                    spec.sliding_window,
                    policy,
                    cache.enable_prefix_caching,
                    self.hasher,
                )
            )
        self.coordinator = KVCacheCoordinator(full, windows)
        self.stats = PrefixCacheStats()
        # Junctions are window checkpoints: without a window group there are none to keep.
        self.enable_junction_checkpoints = cache.enable_junction_checkpoints and bool(windows)
        self.bounded_replay = spec.bounded_replay if windows else None
        self.copies: list[BlockCopy] = []  # this step's, drained by the scheduler
        self.num_partial_block_copies = 0

    @property
    def block_pool(self) -> BlockPool:
        """The full-attention group's pool (usage, pins, tests)."""
        return self.coordinator.full.block_pool

    @property
    def sliding(self) -> SlidingWindowManager | None:
        """The sliding-window group's manager, if the model has one (stats, tests)."""
        windows = self.coordinator.others
        return next((m for m in windows if isinstance(m, SlidingWindowManager)), None)

    def usage(self) -> float:
        return self.block_pool.usage()

    def make_stats(self) -> KVCacheStats:
        """A snapshot of the cache's use and counters (counted since start, not reset)."""
        prefix, sliding = self.stats, self.sliding
        return KVCacheStats(
            usage=self.usage(),
            prefix_cache_queries=prefix.queries,
            prefix_cache_hits=prefix.hits,
            num_lost_to_retention=prefix.lost_to_retention,
            num_lost_to_alignment=prefix.lost_to_alignment,
            num_lost_to_eviction=prefix.lost_to_eviction,
            num_cold_tokens=prefix.cold,
            num_partial_block_copies=self.num_partial_block_copies,
            num_checkpoints=len(sliding.checkpoints) if sliding else 0,
            num_checkpoint_blocks=sliding.block_pool.num_cached_blocks if sliding else 0,
            num_junction_checkpoints=sliding.num_junction_checkpoints if sliding else 0,
        )

    def new_step(self) -> None:
        """A schedule begins: blocks cached from now on are computed by this step's forward."""
        self.coordinator.new_step()

    def take_copies(self) -> list[BlockCopy]:
        copies, self.copies = self.copies, []
        return copies

    def empty_blocks(self) -> KVCacheBlocks:
        return KVCacheBlocks(tuple([] for _ in self.coordinator.managers))

    def get_computed_blocks(self, request: Request) -> tuple[PrefixCacheHit, int]:
        """The longest cached prefix the request can resume from, and its length in tokens.

        At least the last token is always left to compute: its logits are needed.
        """
        if not self.enable_prefix_caching:
            cold = PrefixReuse.cold(request.num_tokens)
            return PrefixCacheHit(self.empty_blocks(), reuse=cold), 0
        self.hasher.update(request)
        found = self.coordinator.find_longest_cache_hit(request, request.num_tokens - 1)
        reused = found.position
        hits = found.hits
        partial = None
        if reused % self.block_size:
            partial = PartialBlock(tuple(hit.source for hit in hits), reused % self.block_size)
        reuse, junction = None, 0
        if request.num_cached_tokens < 0:  # accounted once, when first admitted
            replay = self._replay_hit(request, found)
            if replay is not None:
                found, reused, hits = replay, replay.position, replay.hits
            reuse, matched = self._account(request, found, replayed=replay is not None)
            if replay is not None:  # from here on its blocks are hashed apart (marked)
                request.replay_start = reused
                request.block_hashes = request.block_hashes[: reused // self.block_size]
            elif self.enable_junction_checkpoints and matched > reused:
                junction = min(matched, request.num_prompt_tokens)
        key = next((hit.key for hit in hits if hit.key is not None), None) if reused else None
        blocks = KVCacheBlocks(tuple(hit.blocks for hit in hits))
        return PrefixCacheHit(blocks, partial, reuse, junction, key), reused

    def _replay_hit(self, request: Request, found: LongestCacheHit) -> LongestCacheHit | None:
        """DeepSeek's bounded replay, where it reaches further than the exact hit: resume at R,
        the last multiple of the alignment at least a window before the end of the full group's
        match, with the compressed state of [0, R) from the cache and no window state; the
        window [R, match) is recomputed, its sliding attention limited to the replayed span."""
        if self.bounded_replay is None or request.replay_start is not None:
            return None
        window, align = self.bounded_replay.window, self.bounded_replay.alignment
        start = max(0, found.match.num_reusable - window + 1) // align * align
        if start <= found.position:
            return None
        num = start // self.block_size
        full = GroupHit(start, found.match.chain[:num], kind="replay")
        null = self.coordinator.full.block_pool.null_block
        windows = [GroupHit(start, [null] * num, kind="replay") for _ in self.coordinator.others]
        return LongestCacheHit(found.match, [full, *windows], max(found.evicted_position, start))

    def _source(self, found: LongestCacheHit) -> str:
        """What the reuse point came from: a pinned head's blocks, a declared breakpoint or a
        junction's checkpoint, or the block chain."""
        if found.position == 0:
            return "none"
        full = found.hits[0]
        pinned_ids = self.coordinator.full.pinned_block_ids
        held = [*full.blocks, *([full.source] if full.source is not None else [])]
        if any(block.block_id in pinned_ids for block in held):
            return "pinned"
        kind = next((hit.kind for hit in found.hits if hit.kind != "retention"), "retention")
        if kind in ("breakpoint", "junction", "replay"):
            return kind
        return "block_chain"

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed: PrefixCacheHit | None = None,
        junctions: Sequence[int] = (),
    ) -> KVCacheBlocks | None:
        """Blocks for `num_new_tokens` more tokens after what is computed (plus cache hits).

        `junctions`: where the request keeps its window state while it prefills, besides its
        breakpoints and the retention grid (the scheduler's: found by lookups, or shared heads
        that requests waiting on this one resume from).

        Returns the newly allocated blocks per group, or None when a pool cannot hold them
        (then nothing changed).
        """
        hit = new_computed or PrefixCacheHit(self.empty_blocks())
        num_computed = request.num_computed_tokens + len(hit.blocks.blocks[0]) * self.block_size
        if hit.partial is not None:
            num_computed += hit.partial.num_slots
        end = num_computed + num_new_tokens
        new_blocks = self.coordinator.allocate(
            request, num_computed, end, hit.blocks.blocks, junctions
        )
        if new_blocks is None:
            return None
        if hit.partial is not None:
            index = num_computed // self.block_size
            self.copies.extend(self.coordinator.copy_partial(request, hit.partial, index))
            self.num_partial_block_copies += 1
        if hit.reuse is not None and request.num_cached_tokens < 0:
            self.stats.add(hit.reuse)
        return KVCacheBlocks(new_blocks)

    def forget_uncomputed(self, request: Request) -> None:
        """Unregister the request's blocks from its first uncomputed token on: they were
        registered when allocated, and the step that was to write their K/V failed."""
        self.coordinator.full.forget_uncomputed(request)

    def free(self, request: Request) -> None:
        """Release a request's blocks, tail first, so a shared head outlives the tails."""
        self.coordinator.free(request)

    def pin(self, hit: PrefixCacheHit) -> tuple[tuple[KVCacheBlock, ...], ...]:
        """Hold every block a hit resumes from (each group's, and the copy sources) until
        `unpin`; returns them per group."""
        groups = hit.blocks.blocks
        sources = hit.partial.sources if hit.partial is not None else (None,) * len(groups)
        pinned = []
        for manager, blocks, source in zip(self.coordinator.managers, groups, sources, strict=True):
            held = [block for block in blocks if not block.is_null]
            if source is not None:
                held.append(source)
            manager.pin(held, hit.checkpoint_key)
            pinned.append(tuple(held))
        return tuple(pinned)

    def unpin(
        self, blocks: tuple[tuple[KVCacheBlock, ...], ...], checkpoint_key: tuple | None
    ) -> None:
        for manager, held in zip(self.coordinator.managers, blocks, strict=True):
            manager.unpin(held, checkpoint_key)

    def get_block_ids(self, request_id: str) -> list[int]:
        """The full-attention group's block table."""
        return self.coordinator.full.get_block_ids(request_id)

    def get_window_block_ids(self, request_id: str) -> tuple[int, list[int]] | None:
        """Sliding group: (index of the first block in the window, block ids from there)."""
        sliding = self.sliding
        return sliding.window_block_ids(request_id) if sliding is not None else None

    def _account(
        self, request: Request, found: LongestCacheHit, *, replayed: bool = False
    ) -> tuple[PrefixReuse, int]:
        """Where the prompt's tokens went (see prefix_reuse), and where it leaves the cached
        range (the matched length): past the chain, a partial match with a cached block
        continuing it, then blocks evicted since."""
        size, hashes = self.block_size, request.block_hashes
        full, chain = self.coordinator.full, found.match.chain
        common = max((n for _, n in full.children(request, chain)), default=0)
        matched = max(len(chain) * size + common, found.match.num_reusable)
        evicted_upto = matched
        if len(chain) < len(hashes) and full.block_pool.was_evicted(hashes[len(chain)]):
            index = len(chain)
            while index < len(hashes) and full.block_pool.was_evicted(hashes[index]):
                index += 1
            evicted_upto = max(index * size, matched)
        reuse = PrefixReuse.from_positions(
            request.num_tokens,
            reused=found.position,
            checkpoint_evicted_upto=found.evicted_position,
            reusable=found.match.num_reusable,
            matched=matched,
            evicted_upto=evicted_upto,
            source=self._source(found),
            num_replayed_tokens=found.match.num_reusable - found.position if replayed else 0,
        )
        return reuse, matched
