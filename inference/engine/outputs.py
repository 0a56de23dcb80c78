"""What a caller gets back: a finished request's RequestOutput, a stream's StreamDeltas, and
RequestAbortedError for a request its caller gave up on (vLLM's outputs.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from inference.engine.metrics import RequestMetrics


class RequestAbortedError(RuntimeError):
    """The request was aborted before it finished (its caller gave up: see LLMEngine.abort)."""


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    metrics: RequestMetrics


@dataclass(slots=True)
class StreamDelta:
    """What a streamed request added since the last delta; `output` is set on the last one."""

    text: str  # safe to show: no half character, no part of a stop string
    token_ids: list[int] = field(default_factory=list)
    output: RequestOutput | None = None
    request_id: str = ""  # for LLMEngine.abort
