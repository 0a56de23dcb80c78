"""KVOffloader: moves full blocks between the device pool and the tiers below it, off the
step's critical path (vLLM's offloading connector; SGLang HiCache's write-through and
prefetch).

Writes (write-behind): after a step's forward, the blocks it filled are copied out of the device
pool in one gather per KV cache group (the only work on the loop thread), and the writer thread
(writer.py) puts them in the host tier and on disk. A block written or loaded lately is not
written again.

Loads: a request not yet admitted whose chain goes past the device pool's hits is looked up by a
load thread (loader.py), block by block (host, then disk), as far as consecutive blocks are
found. The request is "loading" meanwhile: the scheduler skips it, and every other request's
steps go on. A load that has read no block for `load_timeout_s` (a stuck mount, a file that
never answers) is given up: the request recomputes, the disk tier counts a failed read and never
reads that file again, and failures in a row (or MAX_STUCK_LOADS loads that never came back)
turn the disk tier off. Before the next schedule the loop thread installs what was found: fresh
pool blocks registered under the blocks' chain hashes, their K/V copied in (one scatter per
group). The loaded blocks (and the device hits before them) are held until the request is
admitted, so the schedule that admits it finds them as ordinary prefix-cache hits; then they are
released like any cached block. Requests whose chain continues into blocks a load is already
fetching wait for it, so a head that arrives with several requests is read once.

Sliding-window models: the sliding group's blocks that a window checkpoint keeps are written
too, with a marker per checkpoint on a block boundary (the retention grid's; breakpoints and
junctions inside a block stay in the device pool only). A load then looks, from the end of the
full chain found back, for the last marked checkpoint whose window blocks the tiers hold, and
installs them with the checkpoint's record: the request resumes there as it would from the
device pool, under the same retention rules.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import OrderedDict
from collections.abc import Iterable

import torch

from inference.engine.kv.block_pool import BlockPool, KVCacheBlock
from inference.engine.kv.hashing import BlockHash
from inference.engine.kv.single_type_kv_cache_manager import FullAttentionManager
from inference.engine.kv.tiers.block_file import BlockLayout
from inference.engine.kv.tiers.disk_tier import DiskTier
from inference.engine.kv.tiers.group_io import GroupIO
from inference.engine.kv.tiers.host_tier import HostTier
from inference.engine.kv.tiers.loader import LoadJob, TierLoader
from inference.engine.kv.tiers.writer import TierWriter, WriteJob
from inference.engine.metrics import KVTierStats
from inference.engine.request import Request
from inference.engine.scheduler_output import SchedulerOutput

logger = logging.getLogger(__name__)

MAX_KNOWN_HASHES = 1 << 16
MAX_STUCK_LOADS = 4  # loads given up and not back yet: past this the disk tier is turned off


class KVOffloader:
    def __init__(
        self,
        full: GroupIO,
        sliding: GroupIO | None = None,
        *,
        host: HostTier | None = None,
        disk: DiskTier | None = None,
        load_timeout_s: float = 5.0,
    ) -> None:
        assert host is not None or disk is not None, "no tier to offload to"
        self.load_timeout_s = load_timeout_s
        self.full = full
        self.sliding = sliding
        self.manager: FullAttentionManager = full.manager
        self.block_size = full.layout.block_size
        self.host = host
        self.disk = disk
        if sliding is not None:
            sliding.manager.new_checkpoints = []
        self._known: OrderedDict[tuple[str, BlockHash], None] = OrderedDict()
        # The host tier's checkpoint markers (block hash → kind), bounded like _known.
        self._markers: OrderedDict[BlockHash, str] = OrderedDict()
        self._held: dict[str, tuple[Request, list[tuple[BlockPool, list[KVCacheBlock]]]]] = {}
        self._num_loading = 0
        # Blocks an in-flight load fetches; requests whose chain continues into one of them wait
        # for it (then look up again from the device pool), so a head is read once, not once
        # per request that arrives with it.
        self._loading_hashes: set[BlockHash] = set()
        self._waiters: list[Request] = []
        self._in_flight: dict[str, LoadJob] = {}  # by request id
        self._num_stuck = 0  # loads given up that have not come back
        self._loader = TierLoader(full, sliding, host, disk, self._markers)
        self._writer = TierWriter(host, disk)

    @property
    def layout(self) -> BlockLayout:
        """The full-attention group's block layout."""
        return self.full.layout

    # ---- the loop thread, between steps -------------------------------------------------------

    def prepare(self, waiting: Iterable[Request]) -> None:
        """Before a schedule: release what admitted requests no longer need held, install the
        loads that finished, and start lookups for requests not looked up yet."""
        for request_id, (request, held) in list(self._held.items()):
            if request.num_cached_tokens >= 0 or request.is_finished:
                for pool, blocks in held:
                    pool.free_blocks(list(reversed(blocks)))
                del self._held[request_id]
        while True:
            try:
                job = self._loader.finished.get_nowait()
            except queue.Empty:
                break
            if job.is_abandoned:  # given up before: its request recomputed
                self._num_stuck -= 1
                continue
            self._end_load(job)
            self._install(job)
        self._abandon_stalled_loads()
        waiters, self._waiters = self._waiters, []
        for request in waiters:
            request.kv_load_state = "new"  # looked up again below, past what was loaded
        for request in waiting:
            if request.kv_load_state == "new":
                self._look_up(request)

    def _end_load(self, job: LoadJob) -> None:
        del self._in_flight[job.request.request_id]
        self._num_loading -= 1
        self._loading_hashes.difference_update(job.block_hashes[job.first_index :])

    def _abandon_stalled_loads(self) -> None:
        """Give up loads that have read nothing for load_timeout_s: their requests recompute."""
        now = time.monotonic()
        for job in [
            j for j in self._in_flight.values() if now - j.last_progress > self.load_timeout_s
        ]:
            job.is_abandoned = True
            self._end_load(job)
            self._num_stuck += 1
            job.request.kv_load_state = "done"
            job.request.kv_load_s = now - job.started
            logger.warning(
                "KV tiers: request %s's load read nothing for %.1f s; recomputing",
                job.request.request_id,
                self.load_timeout_s,
            )
            if self.disk is not None:
                reason = f"a load read nothing for {self.load_timeout_s:g} s"
                self.disk.read_failed(reason, stuck=job.reading)
                if self._num_stuck >= MAX_STUCK_LOADS:
                    self.disk.turn_off(f"{self._num_stuck} loads did not come back")

    @property
    def is_loading(self) -> bool:
        return self._num_loading > 0 or bool(self._waiters)

    def wait_for_loads(self, timeout: float) -> None:
        """Block until a load finishes (or `timeout`): the loop's wait when only loading
        requests are left."""
        self._loader.done.wait(timeout)
        self._loader.done.clear()

    def offload(self, output: SchedulerOutput) -> None:
        """After a step's forward: copy the blocks it filled out of the pool, for the writer."""
        size = self.block_size
        blocks: list[KVCacheBlock] = []
        window: list[KVCacheBlock] = []
        for scheduled in output.scheduled:
            request = scheduled.request
            if request.replay_start is not None:  # approximate state: never kept
                continue
            computed = request.num_computed_tokens + scheduled.num_new_tokens
            table = self.manager.req_to_blocks.get(request.request_id, [])
            num_full = min(min(computed, request.num_tokens) // size, len(table))
            blocks += table[request.num_offloaded_blocks : num_full]
            request.num_offloaded_blocks = max(request.num_offloaded_blocks, num_full)
            if self.sliding is not None:  # the window's blocks a checkpoint keeps (hashed)
                held = self.sliding.manager.req_to_blocks.get(request.request_id, [])
                window += [b for b in held[:num_full] if not b.is_null]
        self._offload_group(self.full, blocks, [])
        if self.sliding is not None:
            records, self.sliding.manager.new_checkpoints = self.sliding.manager.new_checkpoints, []
            markers = [(key[0], kind) for key, _, kind in records if key[1] == size]
            self._offload_group(self.sliding, window, markers)

    def _offload_group(
        self, group: GroupIO, blocks: list[KVCacheBlock], markers: list[tuple[BlockHash, str]]
    ) -> None:
        name = group.layout.group
        new = [
            b
            for b in blocks
            if b.block_hash is not None
            and b.token_ids is not None
            and not self._remember((name, b.block_hash))
        ]
        for block_hash, kind in markers:
            self._markers[block_hash] = kind
            if len(self._markers) > MAX_KNOWN_HASHES:
                self._markers.popitem(last=False)
        if not new and not (markers and self.disk is not None):
            return
        if not self._writer.reserve(len(new) * group.layout.num_bytes):
            logger.warning("KV tiers: writer behind; %d blocks not offloaded", len(new))
            for block in new:
                self._known.pop((name, block.block_hash), None)
            return
        ids = [b.block_id for b in new]
        payload = group.read_blocks(ids) if ids else torch.empty(0)
        size = self.block_size
        blocks = [payload[:, i * size : (i + 1) * size].clone() for i in range(len(ids))]
        hashes, tokens = [b.block_hash for b in new], [b.token_ids for b in new]
        self._writer.put(WriteJob(group, hashes, tokens, blocks, markers))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every block copied out so far is written; False on timeout."""
        return self._writer.flush(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Finish the writes queued (bounded by `timeout`), then stop both threads."""
        self._writer.close(timeout)
        # A load thread stuck in a read (given up) would only come back with its read.
        self._loader.close(timeout if self._num_stuck == 0 else min(timeout, 1.0))

    def make_stats(self) -> dict[str, KVTierStats]:
        tiers = [tier for tier in (self.host, self.disk) if tier is not None]
        return {tier.name: tier.make_stats() for tier in tiers}

    def _remember(self, key: tuple[str, BlockHash]) -> bool:
        """Whether the block was written or loaded lately (then it is not written again);
        remembers it either way."""
        seen = key in self._known
        self._known[key] = None
        self._known.move_to_end(key)
        if len(self._known) > MAX_KNOWN_HASHES:
            self._known.popitem(last=False)
        return seen

    def _look_up(self, request: Request) -> None:
        """Start loading the request's chain past the device pool's hits, if it has any."""
        request.kv_load_state = "done"
        if (
            request.num_cached_tokens >= 0
            or request.replay_start is not None
            or request.is_finished
            or (self.host is None and not self.disk.is_readable)
        ):
            return
        self.manager.hasher.update(request)
        size = self.block_size
        # Blocks wholly before the last prompt token (its logits are always computed).
        usable = min((request.num_tokens - 1) // size, len(request.block_hashes))
        first = len(self.manager.live_chain(request))
        # A load may take at most three quarters of the pool: others need room too.
        last = min(usable, first + self.manager.block_pool.num_blocks * 3 // 4)
        if first >= last:
            return
        if request.block_hashes[first] in self._loading_hashes:
            request.kv_load_state = "loading"
            self._waiters.append(request)
            return
        tokens = request.all_token_ids
        job = LoadJob(
            request,
            first,
            request.block_hashes[:last],
            [tuple(tokens[i * size : (i + 1) * size]) for i in range(last)],
            [self.manager.hasher.parent_hash(request, i) for i in range(last)],
            time.monotonic(),
        )
        request.kv_load_state = "loading"
        self._num_loading += 1
        self._loading_hashes.update(job.block_hashes[first:])
        self._in_flight[request.request_id] = job
        self._loader.put(job)

    def _install(self, job: LoadJob) -> None:
        """Put a finished load's blocks in the pools, held (with the device hits before them)
        until the request is admitted."""
        request = job.request
        request.kv_load_state = "done"
        chain = self.manager.live_chain(request)
        if request.is_finished or not job.found or len(chain) < job.first_index:
            request.kv_load_s = time.monotonic() - job.started
            return
        num_chain = min(len(chain), job.first_index + len(job.found))
        # Hold the device hits first: taking fresh blocks must not evict them.
        self.manager.block_pool.touch(chain[:num_chain])
        start = num_chain - job.first_index
        installed, spans = self._put(self.full, job, job.first_index + start, job.found[start:])
        held = [(self.manager.block_pool, chain[:num_chain] + installed)]
        window = job.window
        if window is not None and window.position // self.block_size <= num_chain + len(installed):
            blocks, _ = self._put(self.sliding, job, window.first_index, window.found, hits=True)
            held.append((self.sliding.manager.block_pool, blocks))
            if len(blocks) == len(window.found):
                key = (job.block_hashes[window.position // self.block_size - 1], self.block_size)
                self.sliding.manager.record_checkpoint(key, window.position, window.kind)
        self._held[request.request_id] = (request, held)
        request.kv_loaded_spans = spans
        request.kv_load_s = time.monotonic() - job.started

    def _put(
        self,
        group: GroupIO,
        job: LoadJob,
        first_index: int,
        found: list[tuple[str, torch.Tensor]],
        hits: bool = False,
    ) -> tuple[list[KVCacheBlock], list[tuple[int, int, str]]]:
        """Install `found` (blocks first_index on) in the group's pool, as far as room allows
        (with `hits`, blocks the pool already holds are taken as they are); returns the blocks,
        each with one reference, and the token spans by tier."""
        pool = group.manager.block_pool
        size = self.block_size
        blocks, block_ids, payloads, spans = [], [], [], []
        for offset, (tier, payload) in enumerate(found):
            index = first_index + offset
            block_hash, tokens = job.block_hashes[index], job.token_ids[index]
            cached = pool.get_cached_block(block_hash, tokens) if hits else None
            if cached is not None:
                pool.touch([cached])
                blocks.append(cached)
                continue
            if pool.num_free_blocks <= pool.num_blocks // 4:  # leave room for running requests
                break
            (block,) = pool.get_new_blocks(1)
            pool.cache_block(block, block_hash, tokens, job.parents[index])
            blocks.append(block)
            block_ids.append(block.block_id)
            payloads.append(payload)
            self._remember((group.layout.group, block_hash))
            start = index * size
            if spans and spans[-1][2] == tier and spans[-1][1] == start:
                spans[-1] = (spans[-1][0], start + size, tier)
            else:
                spans.append((start, start + size, tier))
        if block_ids:
            group.write_blocks(block_ids, torch.cat(payloads, dim=1))
        return blocks, spans
