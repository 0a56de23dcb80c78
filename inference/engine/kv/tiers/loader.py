"""TierLoader: the load threads. For each job one of them reads a request's chain, block by
block, from host memory then disk, as far as consecutive blocks are found (a disk hit is kept in
host memory too); on a sliding-window model, then the last marked window checkpoint within that
chain whose window blocks the tiers hold. Finished jobs go back to the loop thread (`finished`).

Several threads (started as jobs need them, up to MAX_LOAD_THREADS), so that one read that does
not come back (a stuck network mount) holds up its own job only: each job notes when it last
read a block and which block it is reading, and the offloader gives up a job that has made no
progress for its timeout (the thread stays stuck in the kernel; its job, when it comes back,
is dropped).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from inference.engine.kv.hashing import BlockHash
from inference.engine.kv.tiers.block_file import BlockLayout
from inference.engine.kv.tiers.disk_tier import DiskTier
from inference.engine.kv.tiers.group_io import GroupIO
from inference.engine.kv.tiers.host_tier import HostTier
from inference.engine.request import Request

logger = logging.getLogger(__name__)

MAX_CHECKPOINT_PROBES = 64  # block boundaries looked at, from the chain's end back
MAX_LOAD_THREADS = 8


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
    # Set by the load thread: when it last finished reading a block (or `started`), and the
    # disk block it is reading now. Read by the loop thread to give the job up.
    last_progress: float = 0.0
    reading: tuple[BlockLayout, BlockHash] | None = None
    is_abandoned: bool = False  # given up by the loop thread: stop, nothing is installed

    def __post_init__(self) -> None:
        self.last_progress = self.last_progress or self.started


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
        self._threads: list[threading.Thread] = []
        self._num_idle = 0
        self._lock = threading.Lock()
        with self._lock:
            self._start_thread()  # one from the start; more when jobs find none idle

    def put(self, job: LoadJob) -> None:
        with self._lock:
            if self._num_idle == 0 and len(self._threads) < MAX_LOAD_THREADS:
                self._start_thread()
        self._jobs.put(job)

    def _start_thread(self) -> None:
        name = f"kv-tier-load-{len(self._threads)}"
        thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._threads.append(thread)
        self._num_idle += 1
        thread.start()

    def close(self, timeout: float) -> None:
        """Stop the threads (waiting `timeout` at most: one stuck in a read is left behind)."""
        deadline = time.monotonic() + timeout
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0))

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._num_idle -= 1
            try:
                self._load(job)
            except Exception:  # a bug must not leave the request loading forever
                logger.exception("KV tiers: loading request %s failed", job.request.request_id)
                job.found, job.window = [], None
            with self._lock:
                self._num_idle += 1
            self.finished.put(job)
            self.done.set()

    def _load(self, job: LoadJob) -> None:
        for index in range(job.first_index, len(job.block_hashes)):
            found = self._get(job, self.full, job.block_hashes[index], job.token_ids[index])
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
            kind = self._marker(job, job.block_hashes[num - 1])
            if kind is None:
                continue
            first = sliding.manager.first_needed_block(num * size)
            found = []
            for index in range(first, num):
                got = self._get(job, sliding, job.block_hashes[index], job.token_ids[index])
                if got is None:
                    break
                found.append(got)
            if len(found) == num - first:
                return WindowLoad(num * size, kind, first, found)
        return None

    def _marker(self, job: LoadJob, block_hash: BlockHash) -> str | None:
        kind = self.host_markers.get(block_hash)
        disk = self.disk
        if kind is None and disk is not None and disk.is_readable and not job.is_abandoned:
            job.reading = (self.sliding.layout, block_hash)
            kind = disk.get_marker(self.sliding.layout, block_hash)
            job.reading, job.last_progress = None, time.monotonic()
        return kind

    def _get(
        self, job: LoadJob, group: GroupIO, block_hash: BlockHash, token_ids: tuple[int, ...]
    ) -> tuple[str, torch.Tensor] | None:
        """(tier, K/V) of a block from host memory, else disk (then kept in host memory too);
        None once the job is given up."""
        if job.is_abandoned:
            return None
        key = (group.layout.group, block_hash)
        if self.host is not None:
            payload = self.host.get(key, token_ids)
            if payload is not None:
                job.last_progress = time.monotonic()
                return "host", payload
        disk = self.disk
        if disk is not None and disk.is_readable:
            job.reading = (group.layout, block_hash)
            payload = disk.get(group.layout, block_hash, token_ids)
            job.reading, job.last_progress = None, time.monotonic()
            if payload is not None and not job.is_abandoned:
                if self.host is not None:
                    self.host.put(key, token_ids, payload)
                return "disk", payload
        return None
