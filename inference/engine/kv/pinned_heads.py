"""Pinned prompt heads: computed once (LLMEngine.warm) and kept in the cache until unpinned.

Pinning takes one more reference on every block the head's reuse needs — the full group's
chain and, on a hybrid model, the window checkpoint's blocks where the head ends, plus the
partial block when it ends inside one — so they never reach the free queue and are never
evicted; the checkpoint record is kept too. Pins are bounded by a share of each pool so that
running requests always keep room (beyond it: ValueError).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from inference.engine.kv.block_pool import KVCacheBlock
from inference.engine.kv.kv_cache_manager import KVCacheManager
from inference.engine.request import Request
from inference.engine.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class PinnedHead:
    """What `LLMEngine.warm` hands back; pass it to `LLMEngine.unpin`."""

    handle: int
    num_tokens: int  # the head's length
    num_pinned_tokens: int  # how much of it a later prompt resumes from (the whole head)
    head_hash: str  # hex chain hash of the head's last whole block ("" if shorter than one)
    # The blocks it holds, per KV cache group (the full-attention group first).
    blocks: tuple[tuple[KVCacheBlock, ...], ...] = field(repr=False, default=())
    checkpoint_key: tuple | None = field(repr=False, default=None)


class PinnedHeads:
    def __init__(self, manager: KVCacheManager, max_fraction: float) -> None:
        self.manager = manager
        self.max_fraction = max_fraction
        self.heads: dict[int, PinnedHead] = {}
        self._ids = itertools.count(1)

    def num_pinned_blocks(self) -> int:
        return sum(len(group) for h in self.heads.values() for group in h.blocks)

    def check_room(self, num_tokens: int) -> None:
        """ValueError when a head of `num_tokens` would push the full group's pinned blocks
        past the configured share (checked before computing it)."""
        pool = self.manager.block_pool
        pinned = sum(len(h.blocks[0]) for h in self.heads.values())
        needed = -(-num_tokens // self.manager.block_size)
        allowed = int(self.max_fraction * pool.num_blocks)
        if pinned + needed > allowed:
            raise ValueError(
                f"pinning this head needs {needed} KV blocks; {pinned} are pinned already and "
                f"max_pinned_fraction={self.max_fraction} allows {allowed} of {pool.num_blocks}: "
                "unpin a head, shorten this one, or raise max_pinned_fraction"
            )

    def pin(self, token_ids: list[int], cache_salt: str | None) -> PinnedHead:
        """Pin the cached state of `token_ids` (computed just before, by warm)."""
        manager = self.manager
        self.check_room(len(token_ids))
        manager.new_step()  # the head's last blocks were cached by the step that just ran
        # A probe whose prompt is the head plus one token: it may resume at the head's end.
        probe = Request("pin", [*token_ids, 0], SamplingParams(max_tokens=1, cache_salt=cache_salt))
        probe.num_cached_tokens = 0  # a probe, not accounted
        hit, num_tokens = manager.get_computed_blocks(probe)
        blocks = manager.pin(hit)
        hashes = probe.block_hashes
        whole = len(token_ids) // manager.block_size
        head = PinnedHead(
            next(self._ids),
            len(token_ids),
            num_tokens,
            hashes[whole - 1].hex() if whole else "",
            blocks,
            hit.checkpoint_key,
        )
        self.heads[head.handle] = head
        return head

    def unpin(self, handle: PinnedHead | int) -> None:
        key = handle.handle if isinstance(handle, PinnedHead) else handle
        head = self.heads.pop(key, None)
        if head is None:
            raise ValueError(f"no pinned head with handle {key!r} (already unpinned?)")
        self.manager.unpin(head.blocks, head.checkpoint_key)
