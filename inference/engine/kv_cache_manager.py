"""KVCacheManager: which blocks each request holds, prefix-cache lookups, allocation.

The scheduler talks to it through `KVCacheBlocks` and plain counts; an allocation that
cannot be satisfied returns None and the scheduler decides what to do (preempt or wait).
"""

from __future__ import annotations

from dataclasses import dataclass

from inference.engine.block_pool import BlockPool, KVCacheBlock
from inference.engine.hashing import extra_keys, hash_request_blocks
from inference.engine.request import Request


@dataclass(slots=True)
class KVCacheBlocks:
    blocks: list[KVCacheBlock]

    @property
    def block_ids(self) -> list[int]:
        return [block.block_id for block in self.blocks]


@dataclass(slots=True)
class PrefixCacheStats:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # prompt tokens found


class KVCacheManager:
    def __init__(
        self, num_blocks: int, block_size: int, enable_caching: bool, model_fingerprint: str
    ) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.model_fingerprint = model_fingerprint
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}
        self.stats = PrefixCacheStats()

    def usage(self) -> float:
        return self.block_pool.usage()

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest chain of cached full blocks that starts the request's tokens.

        At least the last token is always left to compute: its logits are needed.
        """
        if not self.enable_caching:
            return KVCacheBlocks([]), 0
        tokens = request.all_token_ids
        self._update_hashes(request)
        max_blocks = (len(tokens) - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for index, block_hash in enumerate(request.block_hashes[:max_blocks]):
            start = index * self.block_size
            block = self.block_pool.get_cached_block(
                block_hash, tuple(tokens[start : start + self.block_size])
            )
            if block is None:
                break
            hits.append(block)
        num_hit_tokens = len(hits) * self.block_size
        if request.num_preemptions == 0:
            self.stats.queries += request.num_prompt_tokens
            self.stats.hits += num_hit_tokens
        return KVCacheBlocks(hits), num_hit_tokens

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: KVCacheBlocks | None = None,
    ) -> KVCacheBlocks | None:
        """Blocks for `num_new_tokens` more tokens after what is computed (plus cache hits).

        Returns the newly allocated blocks, or None when the pool cannot hold them.
        """
        computed = new_computed_blocks.blocks if new_computed_blocks else []
        held = self.req_to_blocks.setdefault(request.request_id, [])
        num_computed = request.num_computed_tokens + len(computed) * self.block_size
        num_required = -(-(num_computed + num_new_tokens) // self.block_size)
        num_new_blocks = num_required - len(held) - len(computed)
        # Hits that sit in the free queue stop being free once we take them.
        num_evictable_hits = sum(1 for block in computed if block.ref_cnt == 0)
        if num_new_blocks > self.block_pool.num_free_blocks - num_evictable_hits:
            return None
        self.block_pool.touch(computed)
        held.extend(computed)
        new_blocks = self.block_pool.get_new_blocks(max(num_new_blocks, 0))
        held.extend(new_blocks)
        if self.enable_caching:
            self._cache_full_blocks(request, num_computed + num_new_tokens)
        return KVCacheBlocks(new_blocks)

    def free(self, request: Request) -> None:
        """Release a request's blocks, tail first, so a shared head outlives the tails."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        self.block_pool.free_blocks(list(reversed(blocks)))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.req_to_blocks.get(request_id, [])]

    def _update_hashes(self, request: Request) -> None:
        request.block_hashes = hash_request_blocks(
            request.all_token_ids,
            self.block_size,
            extra_keys(self.model_fingerprint, request.sampling_params.cache_salt),
            request.block_hashes,
        )

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
            )
        self.num_cached_blocks[request.request_id] = num_full
