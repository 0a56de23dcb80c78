"""SchedulerOutput: what one step runs — the requests scheduled, their new tokens and blocks.

The scheduler builds it, the model runner reads it, and the scheduler takes it back with the
sampled tokens (`Scheduler.update_from_output`); so the runner never imports the scheduler
(vLLM's sched/output.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inference.engine.kv.partial_blocks import BlockCopy
from inference.engine.request import Request
from inference.engine.request_errors import RequestError

# A step's result for one request: its sampled token; with a draft, the model's greedy token at
# each of the draft's positions and the one after (spec_decode); or what failed it.
Sampled = int | list[int] | RequestError


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int
    block_ids: list[int]  # full-attention group
    # Sliding group (hybrid models): (index of the first block in the window, its block ids).
    window_block_ids: tuple[int, list[int]] | None = None
    # Speculative decoding: draft tokens computed after the request's own, counted in
    # num_new_tokens; the runner returns the model's greedy token at each (spec_decode).
    draft_token_ids: list[int] = field(default_factory=list)


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
