"""The host-memory tier: blocks' K/V in CPU tensors, least recently used evicted first, under a
byte budget, keyed by (KV cache group, chain hash). Shared by the writer thread (puts) and the
load thread (gets): one lock."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import torch

from inference.engine.kv.hashing import BlockHash
from inference.engine.metrics import KVTierStats

HostKey = tuple[str, BlockHash]  # (group, chain hash)


class HostTier:
    name = "host"

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._blocks: OrderedDict[HostKey, tuple[tuple[int, ...], torch.Tensor]] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = KVTierStats(self.name)

    def __contains__(self, block_hash: HostKey) -> bool:
        with self._lock:
            return block_hash in self._blocks

    def get(self, block_hash: BlockHash, token_ids: tuple[int, ...]) -> torch.Tensor | None:
        """The block's K/V if held with these tokens (a hit refreshes it), else None."""
        started = time.monotonic()
        with self._lock:
            entry = self._blocks.get(block_hash)
            if entry is None or entry[0] != token_ids:
                self.stats.num_misses += 1
                return None
            self._blocks.move_to_end(block_hash)
            self.stats.num_hits += 1
            self.stats.bytes_read += entry[1].nbytes
            self.stats.load_s += time.monotonic() - started
            return entry[1]

    def put(self, block_hash: HostKey, token_ids: tuple[int, ...], payload: torch.Tensor) -> None:
        """Keep a block (its own CPU copy), evicting the least recently used past the budget."""
        if payload.nbytes > self.capacity_bytes:
            return
        with self._lock:
            if block_hash in self._blocks:
                self._blocks.move_to_end(block_hash)
                return
            self._blocks[block_hash] = (token_ids, payload)
            self.stats.num_blocks += 1
            self.stats.bytes_used += payload.nbytes
            self.stats.bytes_written += payload.nbytes
            while self.stats.bytes_used > self.capacity_bytes:
                _, (_, evicted) = self._blocks.popitem(last=False)
                self.stats.num_blocks -= 1
                self.stats.bytes_used -= evicted.nbytes
                self.stats.num_evictions += 1

    def make_stats(self) -> KVTierStats:
        with self._lock:
            return self.stats.snapshot()
