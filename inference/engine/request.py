"""Request: one prompt's life in the engine — its tokens, progress, timings and status."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from inference.engine.kv.hashing import BlockHash
from inference.engine.kv.prefix_reuse import PrefixReuse
from inference.engine.metrics import RequestMetrics
from inference.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from inference.engine.structured_output.structured_output import GrammarState


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self in (
            RequestStatus.FINISHED_STOPPED,
            RequestStatus.FINISHED_LENGTH,
            RequestStatus.FINISHED_ABORTED,
        )


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    grammar: GrammarState | None = None
    generator: torch.Generator | None = None
    # Scheduling class (vLLM's priority policy): lower is served first, FCFS within a class.
    priority: int = 0

    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # set once, when first scheduled
    reuse: PrefixReuse | None = None  # where the prompt's tokens went; set with num_cached_tokens
    num_preemptions: int = 0
    num_forced_tokens: int = 0
    # Speculative decoding: draft tokens verified for it, and those the model agreed with.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # A draft proposed by the model itself (its MTP layer) for the request's current length.
    spec_token_ids: list[int] = field(default_factory=list)
    block_hashes: list[BlockHash] = field(default_factory=list)
    # Token-exact positions where the window state is kept while prefilling (hybrid models):
    # declared breakpoints (sampling params, chat messages marked "cache").
    cache_breakpoints: list[int] = field(default_factory=list)
    # DeepSeek's bounded replay: where this request resumed by recomputing its window over the
    # cached compressed state (approximate). Its blocks from there are hashed apart (marked) and
    # it keeps no window checkpoints, so nothing it computes is ever taken for exact state.
    replay_start: int | None = None
    # KV tiers (kv/tiers): "new" (not looked up), "loading" (its blocks are being loaded from
    # host memory or disk: the scheduler skips it) or "done"; the token spans loaded, each
    # (start, end, tier); the time the lookup and load took; the blocks copied out so far.
    kv_load_state: str = "new"
    kv_loaded_spans: list[tuple[int, int, str]] = field(default_factory=list)
    kv_load_s: float = 0.0
    num_offloaded_blocks: int = 0
    # The time its JSON schema took to compile (or to come from the grammar cache) before the
    # request was queued: not part of queue_s or e2e_s, which count from arrival.
    grammar_compile_s: float = 0.0
    output_text: str = ""
    # Set when this request alone failed in the engine (sampling, its grammar, detokenizing, a
    # stop check): it is finished and its caller gets this error; the others go on.
    error: BaseException | None = None
    # Called on the engine's loop thread with each sampled token (streaming): must be quick.
    on_token: Callable[[int], None] | None = None

    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def reuse_source(self) -> str:
        """What the reuse point came from: none | block_chain | breakpoint | junction | pinned"""
        return self.reuse.source if self.reuse is not None else "none"

    def append_output_token(self, token_id: int, now: float) -> None:
        self.output_token_ids.append(token_id)
        if self.first_token_time is None:
            self.first_token_time = now
        self.last_token_time = now
        if self.on_token is not None:  # streaming: sampled and jump-forward tokens alike
            self.on_token(token_id)

    def num_cached_tokens_from(self, tier: str) -> int:
        """Of the cached tokens, those whose blocks were loaded from `tier` ("host", "disk")."""
        cached = max(self.num_cached_tokens, 0)
        return sum(
            max(0, min(end, cached) - start)
            for start, end, source in self.kv_loaded_spans
            if source == tier
        )

    def metrics(self, weights: str = "fp32", kv_cache_dtype: str = "float32") -> RequestMetrics:
        """The request's metrics; `weights` and `kv_cache_dtype`: what the engine's model ran."""
        arrival = self.arrival_time
        scheduled = self.first_scheduled_time or arrival
        first = self.first_token_time or scheduled
        last = self.last_token_time or first
        reuse = self.reuse or PrefixReuse(self.num_prompt_tokens)
        return RequestMetrics(
            queue_s=scheduled - arrival,
            prefill_s=first - scheduled,
            decode_s=last - first,
            ttft_s=first - arrival,
            e2e_s=last - arrival,
            num_prompt_tokens=self.num_prompt_tokens,
            num_cached_tokens=max(self.num_cached_tokens, 0),
            num_output_tokens=len(self.output_token_ids),
            num_preemptions=self.num_preemptions,
            num_forced_tokens=self.num_forced_tokens,
            num_draft_tokens=self.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens,
            num_lost_to_retention=reuse.num_lost_to_retention,
            num_lost_to_alignment=reuse.num_lost_to_alignment,
            num_lost_to_eviction=reuse.num_lost_to_eviction,
            num_cold_tokens=reuse.num_cold_tokens,
            reuse_source=self.reuse_source,
            num_replayed_tokens=reuse.num_replayed_tokens,
            num_cached_tokens_host=self.num_cached_tokens_from("host"),
            num_cached_tokens_disk=self.num_cached_tokens_from("disk"),
            kv_load_s=self.kv_load_s,
            grammar_compile_s=self.grammar_compile_s,
            weights=weights,
            kv_cache_dtype=kv_cache_dtype,
            priority=self.priority,
        )
