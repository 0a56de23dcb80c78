"""Scheduler: continuous batching under a token budget, chunked prefill, preemption.

Each step it first tops up the running requests (one token for those decoding, a chunk for
those still prefilling), preempting the newest running request by recompute when the pool
is full, then admits waiting requests while budget and blocks allow.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from inference.engine.kv_cache_manager import KVCacheManager
from inference.engine.request import Request, RequestStatus


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
    ) -> None:
        self.kv_cache_manager = kv_cache_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput()
        budget = self.max_num_batched_tokens
        now = time.monotonic()
        manager = self.kv_cache_manager

        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            while True:
                new_blocks = manager.allocate_slots(request, num_new)
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

        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            if output.preempted_ids:
                break  # memory is short this step; do not admit more
            request = self.waiting[0]
            computed_blocks, num_hit_tokens = manager.get_computed_blocks(request)
            num_new = min(request.num_tokens - num_hit_tokens, budget)
            if manager.allocate_slots(request, num_new, computed_blocks) is None:
                break
            self.waiting.popleft()
            request.num_computed_tokens = num_hit_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit_tokens
                request.reuse = computed_blocks.reuse
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            output.scheduled.append(self._scheduled(request, num_new))
            budget -= num_new
        return output

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

    def _preempt(self, request: Request) -> None:
        """Free everything and start over later; the tokens so far are kept and recomputed."""
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
