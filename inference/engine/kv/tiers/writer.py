"""TierWriter: the writer thread. It puts blocks copied out of the device pool into host memory
and on disk (then the checkpoint markers that name them), and runs the disk tier's sweeper.
The loop thread only hands it jobs; `flush` waits until they are written."""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field

import torch

from inference.engine.kv.hashing import BlockHash
from inference.engine.kv.tiers.disk_tier import DiskTier
from inference.engine.kv.tiers.group_io import GroupIO
from inference.engine.kv.tiers.host_tier import HostTier

logger = logging.getLogger(__name__)

# Blocks copied out and not written yet: past this, a step's new blocks are not offloaded.
MAX_PENDING_WRITE_BYTES = 512 << 20


@dataclass(slots=True)
class WriteJob:
    group: GroupIO
    block_hashes: list[BlockHash]
    token_ids: list[tuple[int, ...]]
    # One tensor per block, (rows, block_size, n_kv_heads, head_dim), on the CPU, each its own
    # copy: cut by the loop thread, so that this thread runs no multi-threaded torch op (see
    # LLMEngine._run_engine_thread).
    payloads: list[torch.Tensor]
    markers: list[tuple[BlockHash, str]] = field(default_factory=list)  # after the blocks


class TierWriter:
    def __init__(self, host: HostTier | None, disk: DiskTier | None) -> None:
        self.host = host
        self.disk = disk
        self._jobs: queue.SimpleQueue[WriteJob | None] = queue.SimpleQueue()
        self._pending = threading.Condition()
        self._pending_bytes = 0
        self._pending_jobs = 0
        self._thread = threading.Thread(target=self._run, name="kv-tier-write", daemon=True)
        self._thread.start()

    def reserve(self, num_bytes: int) -> bool:
        """Make room for a job of `num_bytes` in the queue; False when the writer is too far
        behind (then the job is dropped: its blocks stay in the device pool only)."""
        with self._pending:
            if self._pending_bytes + num_bytes > MAX_PENDING_WRITE_BYTES:
                return False
            self._pending_bytes += num_bytes
            self._pending_jobs += 1
            return True

    def put(self, job: WriteJob) -> None:
        """Queue a job `reserve` made room for."""
        self._jobs.put(job)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every job queued so far is written; False on timeout."""
        with self._pending:
            return self._pending.wait_for(lambda: self._pending_jobs == 0, timeout)

    def close(self, timeout: float) -> None:
        self.flush(timeout)
        self._jobs.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        if self.disk is not None:
            self.disk.maybe_sweep()
        while (job := self._jobs.get()) is not None:
            try:
                self._write(job)
            except Exception:
                logger.exception("KV tiers: writing %d blocks failed", len(job.block_hashes))
            with self._pending:
                self._pending_bytes -= len(job.block_hashes) * job.group.layout.num_bytes
                self._pending_jobs -= 1
                self._pending.notify_all()

    def _write(self, job: WriteJob) -> None:
        layout = job.group.layout
        for block_hash, token_ids, payload in zip(
            job.block_hashes, job.token_ids, job.payloads, strict=True
        ):
            if self.host is not None:
                self.host.put((layout.group, block_hash), token_ids, payload)
            if self.disk is not None:
                self.disk.put(layout, block_hash, token_ids, payload)
        if self.disk is not None:
            for block_hash, kind in job.markers:  # after the window's blocks
                self.disk.put_marker(layout, block_hash, kind)
            self.disk.maybe_sweep()
