"""TierLoader: the load thread. For each job it reads a request's chain, block by block, from
host memory then disk, as far as consecutive blocks are found (a disk hit is kept in host memory
too); on a sliding-window model, then the last marked window checkpoint within that chain whose
window blocks the tiers hold. Finished jobs go back to the loop thread (`finished`)."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from inference.engine.core.request import Request
from inference.engine.kv.hashing import BlockHash
from inference.engine.kv.tiers.disk_tier import DiskTier
from inference.engine.kv.tiers.group_io import GroupIO
from inference.engine.kv.tiers.host_tier import HostTier

logger = logging.getLogger(__name__)

MAX_CHECKPOINT_PROBES = 64  # block boundaries looked at, from the chain's end back


@dataclass(slots=True)
class WindowLoad:
    position: int  # the checkpoint (a block boundary)
    kind: str
    first_index: int  # the window's first block
    found: list[tuple[str, torch.Tensor]]  # (tier, K/V) of blocks first_index .. position/B


@dataclass(slots=True)
class LoadJob:
    request: Request
    first_index: int  # the chain's first block not in the device pool when looked up
    block_hashes: list[BlockHash]  # the request's usable blocks, from 0
    token_ids: list[tuple[int, ...]]
    parents: list[BlockHash | None]
    started: float
    found: list[tuple[str, torch.Tensor]] = field(default_factory=list)  # from first_index on
    window: WindowLoad | None = None


class TierLoader:
    def __init__(
        self,
        full: GroupIO,
        sliding: GroupIO | None,
        host: HostTier | None,
        disk: DiskTier | None,
        host_markers: Mapping[BlockHash, str],
    ) -> None:
        self.full = full
        self.sliding = sliding
        self.host = host
        self.disk = disk
        self.host_markers = host_markers  # the host tier's checkpoint markers (the offloader's)
        self._jobs: queue.SimpleQueue[LoadJob | None] = queue.SimpleQueue()
        self.finished: queue.SimpleQueue[LoadJob] = queue.SimpleQueue()
        self.done = threading.Event()  # set when a job finishes
        self._thread = threading.Thread(target=self._run, name="kv-tier-load", daemon=True)
        self._thread.start()

    def put(self, job: LoadJob) -> None:
        self._jobs.put(job)

    def close(self, timeout: float) -> None:
        self._jobs.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                self._load(job)
            except Exception:  # a bug must not leave the request loading forever
                logger.exception("KV tiers: loading request %s failed", job.request.request_id)
                job.found, job.window = [], None
            self.finished.put(job)
            self.done.set()

    def _load(self, job: LoadJob) -> None:
        for index in range(job.first_index, len(job.block_hashes)):
            found = self._get(self.full, job.block_hashes[index], job.token_ids[index])
            if found is None:
                break
            job.found.append(found)
        if self.sliding is not None and job.found:
            job.window = self._load_window(job)

    def _load_window(self, job: LoadJob) -> WindowLoad | None:
        """The last marked checkpoint within the chain whose window blocks the tiers hold."""
        sliding = self.sliding
        size = sliding.layout.block_size
        end = job.first_index + len(job.found)
        for num in range(end, max(end - MAX_CHECKPOINT_PROBES, 0), -1):
            kind = self._marker(job.block_hashes[num - 1])
            if kind is None:
                continue
            first = sliding.manager.first_needed_block(num * size)
            found = []
            for index in range(first, num):
                got = self._get(sliding, job.block_hashes[index], job.token_ids[index])
                if got is None:
                    break
                found.append(got)
            if len(found) == num - first:
                return WindowLoad(num * size, kind, first, found)
        return None

    def _marker(self, block_hash: BlockHash) -> str | None:
        kind = self.host_markers.get(block_hash)
        if kind is None and self.disk is not None:
            kind = self.disk.get_marker(self.sliding.layout, block_hash)
        return kind

    def _get(
        self, group: GroupIO, block_hash: BlockHash, token_ids: tuple[int, ...]
    ) -> tuple[str, torch.Tensor] | None:
        """(tier, K/V) of a block from host memory, else disk (then kept in host memory too)."""
        key = (group.layout.group, block_hash)
        if self.host is not None:
            payload = self.host.get(key, token_ids)
            if payload is not None:
                return "host", payload
        if self.disk is not None:
            payload = self.disk.get(group.layout, block_hash, token_ids)
            if payload is not None:
                if self.host is not None:
                    self.host.put(key, token_ids, payload)
                return "disk", payload
        return None
