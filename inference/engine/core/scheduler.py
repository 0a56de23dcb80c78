"""Scheduler: continuous batching under a token budget, chunked prefill, preemption; and what
a step's sampled tokens do to its requests (`update_from_output`: append, grammar, stop,
jump-forward, finish), as nano-vllm's postprocess and vLLM's update_from_output.

Each step it first tops up the running requests (one token for those decoding, a chunk for
those still prefilling), preempting the newest running request by recompute when the pool
is full, then admits waiting requests while budget and blocks allow.

Speculative decoding (spec_decode): a decoding greedy request gets a draft from the
drafter, scheduled with its next token in one chunk; `update_from_output` keeps the draft's
longest prefix the model agrees with, plus the model's own token after it.

One prefill per shared head: a waiting request that shares an uncached head with a request
ahead of it (see shared_prefill) is held back until that leader has computed the head (and,
on a hybrid model, kept a checkpoint where the head ends); requests behind it are still
admitted, so batching continues.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inference.engine.config import SchedulerConfig
from inference.engine.kv.kv_cache_manager import KVCacheManager
from inference.engine.kv.shared_prefill import find_followers
from inference.engine.metrics import SchedulerStats
from inference.engine.request import Request, RequestStatus
from inference.engine.request_errors import RequestError, RequestNotComputed, request_failed
from inference.engine.scheduler_output import Sampled, ScheduledRequest, SchedulerOutput

if TYPE_CHECKING:
    from inference.engine.loading.tokenizer import Tokenizer
    from inference.engine.spec_decode import Drafter

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache_manager: KVCacheManager,
        *,
        tokenizer: Tokenizer | None = None,
        drafter: Drafter | None = None,
        num_speculative_tokens: int = 0,
    ) -> None:
        """`config.max_model_len` as resolved against the loaded model (None: no limit)."""
        self.kv_cache_manager = kv_cache_manager
        # A step that carries decodes takes prefill chunks of at most this many tokens, so the
        # decoding requests' next token does not wait behind a full-budget chunk.
        self.prefill_chunk_while_decoding = config.prefill_chunk_while_decoding
        # A full-attention model already shares a head computed in the same step (blocks are
        # registered when allocated and each layer writes before it reads); holding requests
        # back would only add a step. A sliding-window model needs the checkpoint.
        self.enable_shared_prefill = (
            config.enable_shared_prefill
            and kv_cache_manager.enable_prefix_caching
            and kv_cache_manager.sliding is not None
        )
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        # For the stop checks: the tokens that end a turn, and the text stop strings are found
        # in (None: no stop tokens, and a request with stop strings cannot be checked).
        self.tokenizer = tokenizer
        self.stop_token_ids = tokenizer.stop_token_ids if tokenizer is not None else frozenset()
        max_model_len = config.max_model_len
        self.max_model_len = max_model_len if max_model_len is not None else sys.maxsize
        self.enable_jump_forward = config.enable_jump_forward
        self.drafter = drafter
        self.num_speculative_tokens = num_speculative_tokens if drafter is not None else 0
        self.num_spec_verifications = 0  # request-steps that carried a draft
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_prefill_tokens = 0
        self.num_forced_tokens = 0
        self.reuse_sources: dict[str, int] = {}
        # Request id → where it keeps its window state while it prefills (hybrid models),
        # handed to every allocation: junctions its lookup found, and shared heads that
        # requests waiting on it resume from. Kept across preemption; dropped when finished.
        self.junctions: dict[str, list[int]] = {}

    def add_request(self, request: Request) -> None:
        """Queue behind every waiting request of its class or a better one (FCFS in a class)."""
        position = len(self.waiting)
        while position > 0 and self.waiting[position - 1].priority > request.priority:
            position -= 1
        self.waiting.insert(position, request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        """One step, class by class (lower priority value first): top up the class's running
        requests, then admit its waiting ones. `running` and `waiting` stay sorted by class,
        so with one class this is plain FCFS, and a later class only gets what is left; while a
        better class prefills, a worse one gets only its decode tokens."""
        self.kv_cache_manager.new_step()
        step = _Step(
            output=SchedulerOutput(),
            budget=self.max_num_batched_tokens,
            now=time.monotonic(),
            held=self._followers() if self.enable_shared_prefill else set(),
            chunk=self._prefill_chunk(),
        )
        for priority in sorted({r.priority for r in [*self.running, *self.waiting]}):
            if not self._top_up(step, priority):
                break
            self._admit(step, priority)
        output = step.output
        output.block_copies = self.kv_cache_manager.take_copies()
        self.num_prefill_tokens += output.num_prefill_tokens
        return output

    def _top_up(self, step: _Step, priority: int) -> bool:
        """Schedule the running requests of this class (one token for those decoding, a chunk
        for those prefilling), preempting from the end of `running` (the worst class, newest
        first) when blocks run out; False when the step can take nothing more."""
        manager = self.kv_cache_manager
        output = step.output
        while step.index < len(self.running) and step.budget > 0:
            request = self.running[step.index]
            if request.priority != priority:
                return True
            num_left = request.num_tokens - request.num_computed_tokens
            if num_left > 1 and step.prefill_class is not None and step.prefill_class < priority:
                step.index += 1  # a better class prefills this step: its first token comes first
                continue
            num_new = min(num_left, step.budget, step.chunk)
            junctions = self.junctions.get(request.request_id, ())
            draft = self._draft(request, num_new, step.budget)
            num_drafted = num_new + len(draft)
            if draft and manager.allocate_slots(request, num_drafted, junctions=junctions) is None:
                draft = []  # memory is short: no draft for it this step (nothing was allocated)
            while not draft:
                new_blocks = manager.allocate_slots(request, num_new, junctions=junctions)
                if new_blocks is not None:
                    break
                victim = self.running.pop()
                self._preempt(victim)
                output.preempted_ids.append(victim.request_id)
                if victim is request:
                    return False
            output.scheduled.append(self._scheduled(request, num_new + len(draft), draft))
            step.budget -= num_new + len(draft)
            step.index += 1
            if num_left > 1 and step.prefill_class is None:
                step.prefill_class = priority
        return step.budget > 0

    def _admit(self, step: _Step, priority: int) -> None:
        """Admit this class's waiting requests while budget, seats and blocks allow; for a
        seat or blocks, running requests of a worse class (not scheduled yet this step) are
        preempted, worst and newest first."""
        manager = self.kv_cache_manager
        output = step.output
        for request in [r for r in self.waiting if r.priority == priority]:
            can_preempt = bool(self.running) and self.running[-1].priority > priority
            if step.budget <= 0 or (output.preempted_ids and not can_preempt):
                break  # out of budget; or memory is short this step: admit no more
            if step.prefill_class is not None and step.prefill_class < priority:
                break  # a better class prefills this step (see _top_up)
            if request.request_id in step.held:
                continue  # its head is being computed by a request ahead of it
            if request.kv_load_state == "loading":
                continue  # its blocks are being loaded from a KV tier (kv/tiers)
            while len(self.running) >= self.max_num_seqs and self._preempt_worse(step, priority):
                pass
            if len(self.running) >= self.max_num_seqs:
                break  # out of seats
            hit, num_hit_tokens = manager.get_computed_blocks(request)
            num_new = min(request.num_tokens - num_hit_tokens, step.budget, step.chunk)
            if hit.junction:  # kept while it prefills past it
                self._add_junction(request, hit.junction)
            junctions = self.junctions.get(request.request_id, ())
            # A failed allocation takes nothing, and a victim's freed blocks stay cached, so
            # the hit stays valid while worse requests make room.
            while (allocated := manager.allocate_slots(request, num_new, hit, junctions)) is None:
                if not self._preempt_worse(step, priority):
                    break
            if allocated is None:
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
                request.first_scheduled_time = step.now
            request.status = RequestStatus.RUNNING
            self.running.insert(step.index, request)  # after its class, before worse ones
            step.index += 1
            if step.prefill_class is None:
                step.prefill_class = priority
            output.scheduled.append(self._scheduled(request, num_new))
            step.budget -= num_new

    def _preempt_worse(self, step: _Step, priority: int) -> bool:
        """Preempt the last running request if its class is worse than `priority`."""
        if len(self.running) <= step.index or self.running[-1].priority <= priority:
            return False
        victim = self.running.pop()
        self._preempt(victim)
        step.output.preempted_ids.append(victim.request_id)
        return True

    def _prefill_chunk(self) -> int:
        """The most prompt tokens one request computes this step: the whole budget, or
        prefill_chunk_while_decoding when a running request is decoding."""
        limit = self.prefill_chunk_while_decoding
        if limit is None or not any(
            r.num_computed_tokens >= r.num_prompt_tokens for r in self.running
        ):
            return self.max_num_batched_tokens
        return limit

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

    def _scheduled(
        self, request: Request, num_new: int, draft: list[int] | None = None
    ) -> ScheduledRequest:
        manager = self.kv_cache_manager
        return ScheduledRequest(
            request,
            num_new,
            manager.get_block_ids(request.request_id),
            manager.get_window_block_ids(request.request_id),
            draft or [],
        )

    def _draft(self, request: Request, num_new: int, budget: int) -> list[int]:
        """Draft tokens to verify after the request's `num_new` tokens this step: only for a
        greedy request whose output has begun and whose tokens all fit the step; no more than
        its output may still take after the model's own token, cut where its grammar refuses."""
        if (
            self.drafter is None
            or not request.sampling_params.is_greedy
            or not request.output_token_ids
            or num_new != request.num_tokens - request.num_computed_tokens
        ):
            return []
        room = min(
            self.num_speculative_tokens,
            budget - num_new,
            request.sampling_params.max_tokens - len(request.output_token_ids) - 1,
            self.max_model_len - request.num_tokens - 1,
        )
        if room < 1:
            return []
        draft = self.drafter.draft(request, room)
        if draft and request.grammar is not None:
            draft = request.grammar.cut_draft(draft, stop_at_forced=self.enable_jump_forward)
        return draft

    # ---- a step's result ----------------------------------------------------------------

    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        sampled: dict[str, Sampled],
        drafts: dict[str, list[int]] | None = None,
    ) -> list[Request]:
        """Advance the step's requests by what it computed and sampled; returns the requests
        that finished. A failure on one request's path (its sampling, grammar, stop check)
        finishes that request alone with a RequestError; the others go on. `drafts`: what the
        model's own draft layer proposed after each request's new tokens (MTP), for the next
        step."""
        finished = []
        now = time.monotonic()
        drafts = drafts or {}
        for scheduled in scheduler_output.scheduled:
            request = scheduled.request
            request.spec_token_ids = []
            num_forced = request.num_forced_tokens
            draft = scheduled.draft_token_ids
            token = sampled.get(request.request_id)
            if isinstance(token, RequestNotComputed):  # left out of the step: nothing written
                self.kv_cache_manager.forget_uncomputed(request)
                request.error = request_failed(request.request_id, token)
                self.finish(request, RequestStatus.FINISHED_ABORTED)
                finished.append(request)
                continue
            # A draft's positions count as computed only once accepted (_verify).
            request.num_computed_tokens += scheduled.num_new_tokens - len(draft)
            if token is None:
                continue
            try:
                if draft:
                    status = self._verify(request, draft, token, now)
                else:
                    status = self._advance(request, token, now)
            except Exception as exc:  # this request's grammar, stop check or a bug on its path
                logger.exception("request %s failed; the others go on", request.request_id)
                request.error = request_failed(request.request_id, exc)
                status = RequestStatus.FINISHED_ABORTED
            if status is not None:
                self.finish(request, status)
                finished.append(request)
            elif request.num_forced_tokens == num_forced:  # else it was made for another place
                request.spec_token_ids = drafts.get(request.request_id, [])
        return finished

    def fail_step(self, scheduler_output: SchedulerOutput, exc: Exception) -> list[Request]:
        """The model step failed: finish the requests it ran with its error (those that only
        waited go on), and forget their blocks' registrations: their K/V was never written."""
        failed = []
        for scheduled in scheduler_output.scheduled:
            request = scheduled.request
            self.kv_cache_manager.forget_uncomputed(request)
            request.error = RequestError(
                f"the engine step running request {request.request_id} failed: "
                f"{type(exc).__name__}: {exc}"
            )
            self.finish(request, RequestStatus.FINISHED_ABORTED)
            failed.append(request)
        return failed

    def _advance(self, request: Request, token: int | RequestError, now: float):
        """Append a sampled token (and what the grammar forces after it); the status to finish
        with, or None while the request goes on."""
        if isinstance(token, RequestError):
            raise token
        request.append_output_token(token, now)
        if request.grammar is not None:
            request.grammar.accept(token)
        status = self.check_stop(request, token)
        if status is None and request.grammar is not None and self.enable_jump_forward:
            status = self._jump_forward(request, now)
        return status

    def _verify(
        self, request: Request, draft: list[int], targets: Sampled, now: float
    ) -> RequestStatus | None:
        """Greedy verification (spec_decode): append the model's token at each row while
        the draft agrees with it, so the draft's accepted prefix and the model's token after it;
        each accepted draft token's K/V was computed by this step."""
        if isinstance(targets, RequestError):
            raise targets
        assert isinstance(targets, list) and len(targets) == len(draft) + 1, "one row per token"
        self.num_spec_verifications += 1
        self.num_draft_tokens += len(draft)
        request.num_draft_tokens += len(draft)
        status = None
        for index, target in enumerate(targets):
            is_accepted = index < len(draft) and target == draft[index]
            num_forced = request.num_forced_tokens
            status = self._advance(request, target, now)
            if is_accepted:
                request.num_computed_tokens += 1
                request.num_accepted_tokens += 1
                self.num_accepted_tokens += 1
            # Jump-forward appended tokens the later rows did not see: they are not valid.
            if status is not None or not is_accepted or request.num_forced_tokens != num_forced:
                break
        return status

    def _jump_forward(self, request: Request, now: float) -> RequestStatus | None:
        """Append the tokens the grammar forces now; the next step computes their K/V together
        with sampling the token after them, so they cost no step of their own."""
        room = min(
            request.sampling_params.max_tokens - len(request.output_token_ids),
            self.max_model_len - request.num_tokens,
        )
        status = None
        for token in request.grammar.accept_forced(room):
            request.append_output_token(token, now)
            request.num_forced_tokens += 1
            self.num_forced_tokens += 1
            status = self.check_stop(request, token)
            if status is not None:
                break
        return status

    def check_stop(self, request: Request, token: int) -> RequestStatus | None:
        """The status to finish with after `token` was appended, or None to go on."""
        params = request.sampling_params
        if not params.ignore_eos and token in self.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if request.grammar is not None and request.grammar.is_terminated:
            return RequestStatus.FINISHED_STOPPED
        if params.stop_list:
            text = self.tokenizer.decode(request.output_token_ids)
            if any(stop in text for stop in params.stop_list):
                return RequestStatus.FINISHED_STOPPED
        if len(request.output_token_ids) >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    # ---- finishing -----------------------------------------------------------------------

    def finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv_cache_manager.free(request)
        self.junctions.pop(request.request_id, None)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """Finish the running or waiting requests with these ids (others are ignored); returns
        them, in running-then-waiting order."""
        ids = set(request_ids)
        found = [r for r in [*self.running, *self.waiting] if r.request_id in ids]
        for request in found:
            self.finish(request, status)
        return found

    def make_stats(self) -> SchedulerStats:
        """A snapshot of the queues and counters (counted since start, not reset)."""
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_preemptions=self.num_preemptions,
            num_prefill_tokens=self.num_prefill_tokens,
            num_forced_tokens=self.num_forced_tokens,
            reuse_sources=dict(self.reuse_sources),
            num_spec_verifications=self.num_spec_verifications,
            num_draft_tokens=self.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens,
        )

    def _preempt(self, request: Request) -> None:
        """Free everything and start over later; the tokens so far are kept and recomputed."""
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        self.num_preemptions += 1
        # Ahead of every waiting request of its class: it was admitted before them.
        position = 0
        while position < len(self.waiting) and self.waiting[position].priority < request.priority:
            position += 1
        self.waiting.insert(position, request)


@dataclass(slots=True)
class _Step:
    """What one `schedule` call has left and has planned so far."""

    output: SchedulerOutput
    budget: int
    now: float
    held: set[str]
    chunk: int
    index: int = 0  # running[:index] are scheduled this step (or held back by a better class)
    # The best class with a request prefilling this step: worse classes get decode tokens only,
    # so a better request's first token does not wait behind their prompt chunks.
    prefill_class: int | None = None
