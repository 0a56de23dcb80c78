"""KVOffloader: moves full blocks between the device pool and the tiers below it, off the
step's critical path (vLLM's offloading connector; SGLang HiCache's write-through and
prefetch).

Writes (write-behind): after a step's forward, the blocks it filled are copied out of the device
pool in one gather (the only work on the loop thread), and the writer thread puts them in the
host tier and on disk. A block this engine wrote or loaded recently is not written again.

Loads: a request not yet admitted whose chain goes past the device pool's hits is looked up by
the load thread, block by block (host, then disk), as far as consecutive blocks are found. The
request is "loading" meanwhile: the scheduler skips it, and every other request's steps go on.
Before the next schedule the loop thread installs what was found: fresh pool blocks registered
under the blocks' chain hashes, their K/V copied in (one scatter). The loaded blocks (and the
device hits before them) are held until the request is admitted, so the schedule that admits
it finds them as ordinary prefix-cache hits; then they are released like any cached block.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from inference.engine.core.metrics import KVTierStats
from inference.engine.core.request import Request
from inference.engine.core.scheduler_output import SchedulerOutput
from inference.engine.kv.block_pool import KVCacheBlock
from inference.engine.kv.hashing import BlockHash
from inference.engine.kv.single_type_kv_cache_manager import FullAttentionManager
from inference.engine.kv.tiers.block_file import BlockLayout
from inference.engine.kv.tiers.disk_tier import DiskTier
from inference.engine.kv.tiers.host_tier import HostTier

logger = logging.getLogger(__name__)

# Blocks copied out and not written yet: past this, a step's new blocks are not offloaded.
MAX_PENDING_WRITE_BYTES = 512 << 20
MAX_KNOWN_HASHES = 1 << 16


@dataclass(slots=True)
class _LoadJob:
    request: Request
    first_index: int  # the chain's first block not in the device pool when looked up
    block_hashes: list[BlockHash]
    token_ids: list[tuple[int, ...]]
    parents: list[BlockHash | None]
    started: float
    found: list[tuple[str, torch.Tensor]] = field(default_factory=list)  # (tier, K/V) in order


@dataclass(slots=True)
class _WriteJob:
    block_hashes: list[BlockHash]
    token_ids: list[tuple[int, ...]]
    payload: torch.Tensor  # (rows, num_blocks * block_size, n_kv_heads, head_dim), on the CPU


class KVOffloader:
    def __init__(
        self,
        layout: BlockLayout,
        manager: FullAttentionManager,
        read_blocks: Callable[[list[int]], torch.Tensor],
        write_blocks: Callable[[list[int], torch.Tensor], None],
        *,
        host: HostTier | None = None,
        disk: DiskTier | None = None,
    ) -> None:
        assert host is not None or disk is not None, "no tier to offload to"
        self.layout = layout
        self.manager = manager
        self.block_size = layout.block_size
        self.read_blocks = read_blocks
        self.write_blocks = write_blocks
        self.host = host
        self.disk = disk
        self._known: OrderedDict[BlockHash, None] = OrderedDict()  # written or loaded lately
        self._held: dict[str, tuple[Request, list[KVCacheBlock]]] = {}
        self._loads: queue.SimpleQueue[_LoadJob | None] = queue.SimpleQueue()
        self._loaded: queue.SimpleQueue[_LoadJob] = queue.SimpleQueue()
        self._num_loading = 0
        self._load_done = threading.Event()
        self._writes: queue.SimpleQueue[_WriteJob | None] = queue.SimpleQueue()
        self._pending = threading.Condition()
        self._pending_bytes = 0
        self._pending_jobs = 0
        self._loader = threading.Thread(target=self._load_loop, name="kv-tier-load", daemon=True)
        self._writer = threading.Thread(target=self._write_loop, name="kv-tier-write", daemon=True)
        self._loader.start()
        self._writer.start()

    # ---- the loop thread, between steps -------------------------------------------------------

    def prepare(self, waiting: Iterable[Request]) -> None:
        """Before a schedule: release what admitted requests no longer need held, install the
        loads that finished, and start lookups for requests not looked up yet."""
        for request_id, (request, blocks) in list(self._held.items()):
            if request.num_cached_tokens >= 0 or request.is_finished:
                self.manager.block_pool.free_blocks(list(reversed(blocks)))
                del self._held[request_id]
        while True:
            try:
                job = self._loaded.get_nowait()
            except queue.Empty:
                break
            self._num_loading -= 1
            self._install(job)
        for request in waiting:
            if request.kv_load_state == "new":
                self._look_up(request)

    @property
    def is_loading(self) -> bool:
        return self._num_loading > 0

    def wait_for_loads(self, timeout: float) -> None:
        """Block until a load finishes (or `timeout`): the loop's wait when only loading
        requests are left."""
        self._load_done.wait(timeout)
        self._load_done.clear()

    def offload(self, output: SchedulerOutput) -> None:
        """After a step's forward: copy the blocks it filled out of the pool, for the writer."""
        size = self.block_size
        block_ids, hashes, tokens = [], [], []
        for scheduled in output.scheduled:
            request = scheduled.request
            if request.replay_start is not None:  # approximate state: never kept
                continue
            computed = min(
                request.num_computed_tokens + scheduled.num_new_tokens, request.num_tokens
            )
            table = self.manager.req_to_blocks.get(request.request_id, [])
            num_full = min(min(computed, request.num_tokens) // size, len(table))
            for index in range(request.num_offloaded_blocks, num_full):
                block = table[index]
                if block.block_hash is None or block.token_ids is None:
                    continue
                if self._remember(block.block_hash):
                    continue
                block_ids.append(block.block_id)
                hashes.append(block.block_hash)
                tokens.append(block.token_ids)
            request.num_offloaded_blocks = max(request.num_offloaded_blocks, num_full)
        if not block_ids:
            return
        num_bytes = len(block_ids) * self.layout.num_bytes
        with self._pending:
            if self._pending_bytes + num_bytes > MAX_PENDING_WRITE_BYTES:
                logger.warning(
                    "KV tiers: the writer is behind; %d blocks not offloaded", len(block_ids)
                )
                for block_hash in hashes:
                    self._known.pop(block_hash, None)
                return
            self._pending_bytes += num_bytes
            self._pending_jobs += 1
        self._writes.put(_WriteJob(hashes, tokens, self.read_blocks(block_ids)))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every block copied out so far is written; False on timeout."""
        with self._pending:
            return self._pending.wait_for(lambda: self._pending_jobs == 0, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Finish the writes queued (bounded by `timeout`), then stop both threads."""
        self.flush(timeout)
        self._writes.put(None)
        self._loads.put(None)
        self._writer.join(timeout)
        self._loader.join(timeout)

    def make_stats(self) -> dict[str, KVTierStats]:
        tiers = [tier for tier in (self.host, self.disk) if tier is not None]
        return {tier.name: tier.make_stats() for tier in tiers}

    def _remember(self, block_hash: BlockHash) -> bool:
        """Whether the block was written or loaded lately (then it is not written again);
        remembers it either way."""
        seen = block_hash in self._known
        self._known[block_hash] = None
        self._known.move_to_end(block_hash)
        if len(self._known) > MAX_KNOWN_HASHES:
            self._known.popitem(last=False)
        return seen

    def _look_up(self, request: Request) -> None:
        """Start loading the request's chain past the device pool's hits, if it has any."""
        request.kv_load_state = "done"
        if request.num_cached_tokens >= 0 or request.replay_start is not None:
            return
        self.manager.hasher.update(request)
        size = self.block_size
        # Blocks wholly before the last prompt token (its logits are always computed).
        usable = min((request.num_tokens - 1) // size, len(request.block_hashes))
        first = len(self.manager.live_chain(request))
        # A load may take at most half the pool: others need room too.
        last = min(usable, first + self.manager.block_pool.num_blocks // 2)
        if first >= last:
            return
        tokens = request.all_token_ids
        job = _LoadJob(
            request,
            first,
            request.block_hashes[first:last],
            [tuple(tokens[i * size : (i + 1) * size]) for i in range(first, last)],
            [self.manager.hasher.parent_hash(request, i) for i in range(first, last)],
            time.monotonic(),
        )
        request.kv_load_state = "loading"
        self._num_loading += 1
        self._loads.put(job)

    def _install(self, job: _LoadJob) -> None:
        """Put a finished load's blocks in the pool, held (with the device hits before them)
        until the request is admitted."""
        request = job.request
        request.kv_load_state = "done"
        pool = self.manager.block_pool
        chain = self.manager.live_chain(request)
        if request.is_finished or not job.found or len(chain) < job.first_index:
            request.kv_load_s = time.monotonic() - job.started
            return
        # Hold the device hits first: taking fresh blocks must not evict them.
        num_chain = min(len(chain), job.first_index + len(job.found))
        held = list(chain[:num_chain])
        pool.touch(held)
        block_ids, payloads, spans = [], [], []
        for offset in range(num_chain - job.first_index, len(job.found)):
            tier, payload = job.found[offset]
            if pool.num_free_blocks <= pool.num_blocks // 4:  # leave room for running requests
                break
            (block,) = pool.get_new_blocks(1)
            pool.cache_block(
                block, job.block_hashes[offset], job.token_ids[offset], job.parents[offset]
            )
            held.append(block)
            block_ids.append(block.block_id)
            payloads.append(payload)
            self._remember(job.block_hashes[offset])
            start = (job.first_index + offset) * self.block_size
            if spans and spans[-1][2] == tier and spans[-1][1] == start:
                spans[-1] = (spans[-1][0], start + self.block_size, tier)
            else:
                spans.append((start, start + self.block_size, tier))
        if block_ids:
            self.write_blocks(block_ids, torch.cat(payloads, dim=1))
        self._held[request.request_id] = (request, held)
        request.kv_loaded_spans = spans
        request.kv_load_s = time.monotonic() - job.started

    # ---- the load thread ----------------------------------------------------------------------

    def _load_loop(self) -> None:
        while (job := self._loads.get()) is not None:
            try:
                self._load(job)
            except Exception:  # a bug must not leave the request loading forever
                logger.exception("KV tiers: loading request %s failed", job.request.request_id)
                job.found = []
            self._loaded.put(job)
            self._load_done.set()

    def _load(self, job: _LoadJob) -> None:
        for block_hash, token_ids in zip(job.block_hashes, job.token_ids, strict=True):
            tier, payload = "host", None
            if self.host is not None:
                payload = self.host.get(block_hash, token_ids)
            if payload is None and self.disk is not None:
                tier = "disk"
                payload = self.disk.get(self.layout, block_hash, token_ids)
                if payload is not None and self.host is not None:
                    self.host.put(block_hash, token_ids, payload)
            if payload is None:
                return
            job.found.append((tier, payload))

    # ---- the writer thread --------------------------------------------------------------------

    def _write_loop(self) -> None:
        if self.disk is not None:
            self.disk.maybe_sweep()
        while (job := self._writes.get()) is not None:
            try:
                self._write(job)
            except Exception:
                logger.exception("KV tiers: writing %d blocks failed", len(job.block_hashes))
            with self._pending:
                self._pending_bytes -= len(job.block_hashes) * self.layout.num_bytes
                self._pending_jobs -= 1
                self._pending.notify_all()

    def _write(self, job: _WriteJob) -> None:
        size = self.block_size
        for index, (block_hash, token_ids) in enumerate(
            zip(job.block_hashes, job.token_ids, strict=True)
        ):
            payload = job.payload[:, index * size : (index + 1) * size].clone()
            if self.host is not None:
                self.host.put(block_hash, token_ids, payload)
            if self.disk is not None:
                self.disk.put(self.layout, block_hash, token_ids, payload)
        if self.disk is not None:
            self.disk.maybe_sweep()
