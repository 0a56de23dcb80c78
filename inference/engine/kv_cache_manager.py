"""KVCacheManager: which blocks each request holds, prefix-cache lookups, allocation.

The scheduler talks to it through `KVCacheBlocks` and plain counts; an allocation that
cannot be satisfied returns None and the scheduler decides what to do (preempt or wait).

A model with sliding-window layers has two KV groups, each with its own block pool and block
tables: the full-attention group (here) and the sliding group (`SlidingWindowManager`). Both
use the same chain hash per block index. A prompt can resume at P only if the full group's
chain hits every block before P and a window checkpoint exists at P. A model without sliding
layers has only the full group and behaves exactly as before.

Reuse is token-exact: when the match ends inside a block (a cached block continues the chain
and its first m tokens match), the request gets a fresh block and the runner copies those m
slots into it before the step's forward (copy-on-write), in both groups. Copies are handed to
the scheduler as `BlockCopy` records, drained once per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inference.engine.block_pool import BlockPool, KVCacheBlock
from inference.engine.hashing import (
    BlockHash,
    extra_keys,
    hash_block_tokens,
    hash_request_blocks,
    root_hash,
)
from inference.engine.metrics import KVCacheStats
from inference.engine.partial_blocks import (
    BlockCopy,
    PartialBlock,
    matching_children,
    partial_source,
)
from inference.engine.prefix_reuse import PrefixReuse
from inference.engine.request import Request
from inference.engine.retention import RetentionPolicy
from inference.engine.sliding_window_manager import SlidingWindowManager


@dataclass(slots=True)
class KVCacheBlocks:
    blocks: list[KVCacheBlock]  # full-attention group
    sliding_blocks: list[KVCacheBlock] = field(default_factory=list)  # the window before P
    reuse: PrefixReuse | None = None  # the lookup's accounting (admission only)
    partial: PartialBlock | None = None
    reuse_source: str = "none"
    junction: int = 0  # where the prompt leaves the cached range, past the reuse point (0: no)
    checkpoint_key: tuple | None = None  # the window checkpoint resumed from (hybrid models)

    @property
    def block_ids(self) -> list[int]:
        return [block.block_id for block in self.blocks]


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


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool,
        model_fingerprint: str,
        *,
        sliding_window: int | None = None,
        retention_interval: int | None = None,
        num_sliding_blocks: int | None = None,
        exact_reuse: bool = False,
        junction_checkpoints: bool = False,
    ) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.model_fingerprint = model_fingerprint
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}
        self.stats = PrefixCacheStats()
        self.exact_reuse = exact_reuse  # copy partial blocks (token-exact reuse)
        self.junction_checkpoints = junction_checkpoints
        self.copies: list[BlockCopy] = []  # this step's, drained by the scheduler
        self.num_partial_block_copies = 0
        self.pinned_block_ids: dict[int, int] = {}  # full-group block id → pin count
        self.sliding: SlidingWindowManager | None = None
        if sliding_window is not None:
            self.sliding = SlidingWindowManager(
                num_sliding_blocks or num_blocks,
                block_size,
                sliding_window,
                RetentionPolicy(retention_interval, block_size, exact_reuse),
                enable_caching,
                self.parent_hash,
            )

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
        self.block_pool.step += 1
        if self.sliding is not None:
            self.sliding.block_pool.step += 1

    def take_copies(self) -> list[BlockCopy]:
        copies, self.copies = self.copies, []
        return copies

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest cached prefix the request can resume from, and its length in tokens.

        At least the last token is always left to compute: its logits are needed.
        """
        if not self.enable_caching:
            return KVCacheBlocks([], reuse=PrefixReuse.cold(request.num_tokens)), 0
        self._update_hashes(request)
        size = self.block_size
        limit = request.num_tokens - 1
        chain = self._live_chain(request)
        children = self._children(request, chain) if self.exact_reuse else []
        if self.exact_reuse:
            ready = [n for block, n in children if self.block_pool.is_ready(block)]
            matching = max(ready, default=0)
            num_reusable = min(len(chain) * size + matching, limit)
        else:
            num_reusable = min(len(chain), limit // size) * size
        reused, evicted_checkpoint = num_reusable, num_reusable
        partial, kind, sliding_hits = None, "retention", []
        if self.sliding is not None:
            checkpoint = self.sliding.find_checkpoint(
                request,
                num_reusable,
                len(chain),
                [(block.block_hash, n) for block, n in children],
            )
            reused, sliding_hits, kind = checkpoint.position, checkpoint.blocks, checkpoint.kind
            evicted_checkpoint = max(checkpoint.evicted_position, reused)
            if checkpoint.partial is not None:
                partial = partial_source(
                    self.block_pool, chain, children, reused, checkpoint.partial, size
                )
                if partial is None:  # its full-group half is not computed yet: resume at 0
                    reused = evicted_checkpoint = 0
                    sliding_hits = []
        elif reused % size:
            partial = partial_source(self.block_pool, chain, children, reused, None, size)
        if reused % size and partial is None:  # the source was not computed before this step
            reused = evicted_checkpoint = reused // size * size
        reuse, junction = None, 0
        if request.num_cached_tokens < 0:  # accounted once, when first admitted
            reuse, matched = self._account(request, chain, reused, evicted_checkpoint, num_reusable)
            if self.sliding is not None and self.junction_checkpoints and matched > reused:
                junction = min(matched, request.num_prompt_tokens)
        hits = KVCacheBlocks(chain[: reused // size], sliding_hits, reuse, partial)
        hits.reuse_source = self._source(hits, reused, kind)
        if self.sliding is not None and reused:
            hits.checkpoint_key = checkpoint.key
        hits.junction = junction
        return hits, reused

    def _children(
        self, request: Request, chain: list[KVCacheBlock]
    ) -> list[tuple[KVCacheBlock, int]]:
        """Cached blocks continuing the chain, with how many of the next tokens they match."""
        start = len(chain) * self.block_size
        parent = chain[-1].block_hash if chain else root_hash(self._extra(request))
        tail = request.all_token_ids[start : start + self.block_size]
        return matching_children(self.block_pool, parent, tail)

    def _source(self, hits: KVCacheBlocks, reused: int, kind: str) -> str:
        if reused == 0:
            return "none"
        pinned = any(b.block_id in self.pinned_block_ids for b in hits.blocks)
        if hits.partial is not None and hits.partial.full.block_id in self.pinned_block_ids:
            pinned = True
        if pinned:
            return "pinned"
        if kind in ("breakpoint", "junction"):
            return kind
        return "block_chain"

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: KVCacheBlocks | None = None,
    ) -> KVCacheBlocks | None:
        """Blocks for `num_new_tokens` more tokens after what is computed (plus cache hits).

        Returns the newly allocated full-group blocks, or None when a pool cannot hold them
        (then nothing changed).
        """
        computed = new_computed_blocks or KVCacheBlocks([])
        held = self.req_to_blocks.setdefault(request.request_id, [])
        num_computed = request.num_computed_tokens + len(computed.blocks) * self.block_size
        if computed.partial is not None:
            num_computed += computed.partial.num_slots
        end = num_computed + num_new_tokens
        num_new_blocks = -(-end // self.block_size) - len(held) - len(computed.blocks)
        # Hits that sit in the free queue stop being free once we take them.
        num_evictable_hits = sum(1 for block in computed.blocks if block.ref_cnt == 0)
        if num_new_blocks > self.block_pool.num_free_blocks - num_evictable_hits:
            return None
        if self.sliding is not None:
            plan = self.sliding.plan(request, num_computed, end, computed.sliding_blocks)
            if not self.sliding.can_allocate(plan):
                return None
        self.block_pool.touch(computed.blocks)
        held.extend(computed.blocks)
        new_blocks = self.block_pool.get_new_blocks(max(num_new_blocks, 0))
        held.extend(new_blocks)
        if self.enable_caching:
            self._cache_full_blocks(request, end)
        if self.sliding is not None:
            self.sliding.allocate(request, num_computed, end, computed.sliding_blocks, plan)
        if computed.partial is not None:
            self._copy_partial(request, computed.partial, num_computed // self.block_size)
        if computed.reuse is not None and request.num_cached_tokens < 0:
            self.stats.add(computed.reuse)
        return KVCacheBlocks(new_blocks)

    def _copy_partial(self, request: Request, partial: PartialBlock, index: int) -> None:
        rid, n = request.request_id, partial.num_slots
        self.copies.append(
            BlockCopy("full", partial.full.block_id, self.req_to_blocks[rid][index].block_id, n)
        )
        if self.sliding is not None and partial.sliding is not None:
            dst = self.sliding.req_to_blocks[rid][index]
            assert dst is not None, "the block after the reuse point is the request's own"
            self.copies.append(BlockCopy("sliding", partial.sliding.block_id, dst.block_id, n))
        self.num_partial_block_copies += 1

    def forget_uncomputed(self, request: Request) -> None:
        """Unregister the request's blocks from its first uncomputed token on: they were
        registered when allocated, and the step that was to write their K/V failed."""
        first = request.num_computed_tokens // self.block_size
        for block in self.req_to_blocks.get(request.request_id, [])[first:]:
            self.block_pool.uncache(block)
        self.num_cached_blocks[request.request_id] = min(
            self.num_cached_blocks.get(request.request_id, 0), first
        )

    def free(self, request: Request) -> None:
        """Release a request's blocks, tail first, so a shared head outlives the tails."""
        tail = self._cache_partial_tail(request) if self.enable_caching else None
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        self.block_pool.free_blocks(list(reversed(blocks)))
        if self.sliding is not None:
            self.sliding.free(request, tail)

    def _cache_partial_tail(self, request: Request) -> tuple[int, BlockHash, tuple] | None:
        """Cache the computed part of the request's last, unfilled block under a hash of its
        own (never a full block's), so a later prompt that matches it copies it (token-exact
        reuse of a whole earlier prompt; a junction or breakpoint in that block)."""
        size = self.block_size
        index, num_slots = divmod(request.num_computed_tokens, size)
        blocks = self.req_to_blocks.get(request.request_id, [])
        if not self.exact_reuse or not num_slots or index >= len(blocks):
            return None
        self._update_hashes(request)
        tokens = tuple(request.all_token_ids[index * size : request.num_computed_tokens])
        parent = request.block_hashes[index - 1] if index else None
        block_hash = hash_block_tokens(parent, tokens, self._extra(request) + b"\x1fpartial")
        self.block_pool.cache_block(
            blocks[index], block_hash, tokens, self.parent_hash(request, index)
        )
        return index, block_hash, tokens

    def get_block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.req_to_blocks.get(request_id, [])]

    def get_window_block_ids(self, request_id: str) -> tuple[int, list[int]] | None:
        """Sliding group: (index of the first block in the window, block ids from there)."""
        return self.sliding.window_block_ids(request_id) if self.sliding is not None else None

    def _update_hashes(self, request: Request) -> None:
        request.block_hashes = hash_request_blocks(
            request.all_token_ids, self.block_size, self._extra(request), request.block_hashes
        )

    def _extra(self, request: Request) -> bytes:
        return extra_keys(self.model_fingerprint, request.sampling_params.cache_salt)

    def parent_hash(self, request: Request, index: int) -> BlockHash:
        """Block `index`'s key in the children index: the chain hash before it, or the root of
        the request's model and salt for the first block."""
        return request.block_hashes[index - 1] if index else root_hash(self._extra(request))

    def _live_chain(self, request: Request) -> list[KVCacheBlock]:
        """Cached full-group blocks that start the request's tokens, as far as they go."""
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

    def _account(
        self,
        request: Request,
        chain: list[KVCacheBlock],
        reused: int,
        evicted_checkpoint: int,
        reusable: int,
    ) -> tuple[PrefixReuse, int]:
        """Where the prompt's tokens went (see prefix_reuse), and where it leaves the cached
        range (the matched length): past the chain, a partial match with a cached block
        continuing it, then blocks evicted since."""
        size, hashes = self.block_size, request.block_hashes
        common = max((n for _, n in self._children(request, chain)), default=0)
        matched = max(len(chain) * size + common, reusable)
        evicted_upto = matched
        if len(chain) < len(hashes) and self.block_pool.was_evicted(hashes[len(chain)]):
            index = len(chain)
            while index < len(hashes) and self.block_pool.was_evicted(hashes[index]):
                index += 1
            evicted_upto = max(index * size, matched)
        reuse = PrefixReuse.from_positions(
            request.num_tokens,
            reused=reused,
            checkpoint_evicted_upto=evicted_checkpoint,
            reusable=reusable,
            matched=matched,
            evicted_upto=evicted_upto,
        )
        return reuse, matched

    def _cache_full_blocks(self, request: Request, num_tokens_after_step: int) -> None:
        """Register the blocks that will be full once this step has run."""
        num_full = min(num_tokens_after_step, request.num_tokens) // self.block_size
        first = self.num_cached_blocks.get(request.request_id, 0)
        if num_full <= first:
            return
        self._update_hashes(request)
        blocks = self.req_to_blocks[request.request_id]
        tokens = request.all_token_ids
        for index in range(first, num_full):
            start = index * self.block_size
            self.block_pool.cache_block(
                blocks[index],
                request.block_hashes[index],
                tuple(tokens[start : start + self.block_size]),
                self.parent_hash(request, index),
            )
        self.num_cached_blocks[request.request_id] = num_full
