"""What one benchmark run measured: a record per request, and the run around them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RequestRecord:
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    queue_s: float
    prefill_s: float
    decode_s: float
    e2e_s: float
    text: str
    finish_reason: str


@dataclass(frozen=True, slots=True)
class RunResult:
    name: str  # "cached", "uncached", "no_schema", "transformers"
    description: str
    records: list[RequestRecord]
    wall_s: float  # first submission → last completion
    schema: dict | None  # the JSON schema outputs were constrained by, if any
    notes: list[str] = field(default_factory=list)
    engine_stats: dict | None = None  # engine-wide counters over the run (deltas)
    # Decode alone, after the run (steady_decode): per token at the run's concurrency, and alone.
    steady_decode_s_per_token: float | None = None
    steady_decode_single_s_per_token: float | None = None
