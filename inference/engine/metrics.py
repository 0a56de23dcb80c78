"""Per-request metrics and engine-wide stats: plain dataclasses handed out as snapshots.

Timing definitions follow vLLM: queue = queued → first scheduled, prefill = first scheduled →
first token, decode = first → last token, TTFT and e2e from arrival.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class RequestMetrics:
    queue_s: float
    prefill_s: float
    decode_s: float
    ttft_s: float
    e2e_s: float
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    num_preemptions: int = 0
    num_forced_tokens: int = 0  # of the output tokens, those the grammar forced (jump-forward)


@dataclass(slots=True)
class EngineStats:
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # of those, tokens found
    kv_cache_usage: float  # share of blocks in use by live requests, 0..1
    num_running: int
    num_waiting: int
    num_preemptions: int
    num_steps: int
    num_forced_tokens: int = 0  # output tokens appended by jump-forward, without a model step

    @property
    def prefix_cache_hit_rate(self) -> float:
        return (
            self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
        )
