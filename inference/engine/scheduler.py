"""Scheduler: continuous batching under a token budget, chunked prefill, preemption.

Each step it first tops up the running requests (one token for those decoding, a chunk for
those still prefilling), preempting the newest running request by recompute when the pool
is full, then admits waiting requests while budget and blocks allow.

One prefill per shared head: a waiting request that shares an uncached head with a request
ahead of it (see shared_prefill) is held back until that leader has computed the head (and,
on a hybrid model, kept a checkpoint where the head ends); requests behind it are still
admitted, so batching continues.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from inference.engine.kv_cache_manager import KVCacheManager
from inference.engine.partial_blocks import BlockCopy
from inference.engine.request import Request, RequestStatus
from inference.engine.shared_prefill import find_followers


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int
    block_ids: list[int]  # full-attention group
    # Sliding group (hybrid models): (index of the first block in the window, its block ids).
    window_block_ids: tuple[int, list[int]] | None = None


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)
    # Partial blocks to copy (token-exact reuse), run before the step's forward.
    block_copies: list[BlockCopy] = field(default_factory=list)

    @property
    def num_prefill_tokens(self) -> int:
        """Prompt tokens computed this step (decode tokens and recomputed outputs excluded)."""
        return sum(
            max(
                min(s.request.num_prompt_tokens, s.request.num_computed_tokens + s.num_new_tokens)
                - s.request.num_computed_tokens,
                0,
            )
            for s in self.scheduled
        )

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_shared_prefill: bool = False,
    ) -> None:
        self.kv_cache_manager = kv_cache_manager
        self.enable_shared_prefill = enable_shared_prefill
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_prefill_tokens = 0
        self.reuse_sources: dict[str, int] = {}
        # Request id → where it keeps its window state while it prefills (hybrid models),
        # handed to every allocation: junctions its lookup found, and shared heads that
        # requests waiting on it resume from. Kept across preemption; dropped when finished.
        self.junctions: dict[str, list[int]] = {}

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput()
        budget = self.max_num_batched_tokens
        now = time.monotonic()
        manager = self.kv_cache_manager
        manager.new_step()
        held = self._followers() if self.enable_shared_prefill else set()

        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            junctions = self.junctions.get(request.request_id, ())
            while True:
                new_blocks = manager.allocate_slots(request, num_new, junctions=junctions)
                if new_blocks is not None:
                    break
                victim = self.running.pop()
                self._preempt(victim)
                output.preempted_ids.append(victim.request_id)
                if victim is request:
                    break
            if new_blocks is None:
                break
            output.scheduled.append(self._scheduled(request, num_new))
            budget -= num_new
            index += 1

        for request in list(self.waiting):
            if budget <= 0 or len(self.running) >= self.max_num_seqs or output.preempted_ids:
                break  # out of budget or seats; or memory is short this step: admit no more
            if request.request_id in held:
                continue  # its head is being computed by a request ahead of it
            hit, num_hit_tokens = manager.get_computed_blocks(request)
            num_new = min(request.num_tokens - num_hit_tokens, budget)
            if hit.junction:  # kept while it prefills past it
                self._add_junction(request, hit.junction)
            junctions = self.junctions.get(request.request_id, ())
            if manager.allocate_slots(request, num_new, hit, junctions) is None:
                break
            self.waiting.remove(request)
            request.num_computed_tokens = num_hit_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit_tokens
                request.reuse = hit.reuse
                self.reuse_sources[request.reuse_source] = (
                    self.reuse_sources.get(request.reuse_source, 0) + 1
                )
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            output.scheduled.append(self._scheduled(request, num_new))
            budget -= num_new
        output.block_copies = manager.take_copies()
        self.num_prefill_tokens += output.num_prefill_tokens
        return output

    def _followers(self) -> set[str]:
        """Waiting requests to hold this step; their leaders keep a checkpoint at the shared
        point (a junction), so the followers resume there once it is computed."""
        candidates = list(self.waiting)[: 4 * self.max_num_seqs]
        prefilling = [r for r in self.running if r.num_computed_tokens < r.num_prompt_tokens]
        followers = find_followers(
            prefilling, candidates, self.kv_cache_manager.block_size, self.junctions
        )
        for leader, shared in followers.values():
            self._add_junction(leader, shared)
        return set(followers)

    def _add_junction(self, request: Request, position: int) -> None:
        junctions = self.junctions.setdefault(request.request_id, [])
        if position not in junctions:
            junctions.append(position)

    def _scheduled(self, request: Request, num_new: int) -> ScheduledRequest:
        manager = self.kv_cache_manager
        return ScheduledRequest(
            request,
            num_new,
            manager.get_block_ids(request.request_id),
            manager.get_window_block_ids(request.request_id),
        )

    def finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv_cache_manager.free(request)
        self.junctions.pop(request.request_id, None)

    def _preempt(self, request: Request) -> None:
        """Free everything and start over later; the tokens so far are kept and recomputed."""
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
