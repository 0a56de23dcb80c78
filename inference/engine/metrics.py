"""Per-request metrics and engine-wide stats: plain dataclasses handed out as snapshots.

Each component makes its own snapshot (`Scheduler.make_stats`, `KVCacheManager.make_stats`,
vLLM's make_stats); `LLMEngine.stats` assembles EngineStats from them. The counters run since
the engine started: a snapshot reads them, it does not reset them.

Timing definitions follow vLLM: queue = queued → first scheduled, prefill = first scheduled →
first token, decode = first → last token, TTFT and e2e from arrival.

Prompt tokens split into cached (reused) + lost to retention / alignment / eviction + cold,
which add up to the prompt length (see prefix_reuse for what each means).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


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
    # Speculative decoding: draft tokens verified, and of those the ones the model agreed with
    # (each is an output token that took no step of its own).
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_lost_to_retention: int = 0  # matched cached blocks, but no window checkpoint there
    num_lost_to_alignment: int = 0  # matched inside a block that is not wholly shared
    num_lost_to_eviction: int = 0  # was cached, evicted since
    num_cold_tokens: int = 0  # never cached
    # Where the reused tokens came from: "none" (nothing reused), "block_chain" (cached blocks
    # and, on a hybrid model, a retention-grid checkpoint), "breakpoint" (a declared cache
    # breakpoint), "junction" (a detected divergence point), "pinned" (a warmed, pinned head),
    # "replay" (DeepSeek's bounded replay: the output is approximate, see num_replayed_tokens).
    reuse_source: str = "none"
    # Bounded replay: prompt tokens recomputed with their window truncated to the replayed span
    # (counted in num_lost_to_retention too); 0 when the reuse was exact.
    num_replayed_tokens: int = 0
    # Of num_cached_tokens, those loaded from a tier below the device pool (kv/tiers), and the
    # time from the lookup's start to the blocks being in the pool (the request waited for it).
    num_cached_tokens_host: int = 0
    num_cached_tokens_disk: int = 0
    kv_load_s: float = 0.0
    # Its JSON schema's compile (0 from the grammar cache), before arrival (Request says why).
    grammar_compile_s: float = 0.0
    # The format the model's linear layers ran in (EngineConfig.weights, "auto" resolved).
    weights: str = "fp32"
    # The KV cache's dtype (EngineConfig.kv_cache_dtype, "auto" resolved).
    kv_cache_dtype: str = "float32"
    # The request's scheduling class (lower first; see Scheduler.schedule).
    priority: int = 0

    def lost_tokens(self) -> dict[str, int]:
        """{reason: tokens} of the prompt tokens that matched the cache but were recomputed."""
        return {
            "retention": self.num_lost_to_retention,
            "alignment": self.num_lost_to_alignment,
            "eviction": self.num_lost_to_eviction,
        }


@dataclass(slots=True)
class SchedulerStats:
    """The scheduler's snapshot: its queues, and counters since start."""

    num_running: int
    num_waiting: int  # in the scheduler (the engine adds the requests not handed to it yet)
    num_preemptions: int
    num_prefill_tokens: int
    num_forced_tokens: int
    reuse_sources: dict[str, int] = field(default_factory=dict)
    num_spec_verifications: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


@dataclass(slots=True)
class KVCacheStats:
    """The KV cache manager's snapshot: block usage, prefix-cache accounting since start (in
    prompt tokens), and the sliding group's window checkpoints (zeros without one)."""

    usage: float  # share of the full group's blocks in use by live requests, 0..1
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_lost_to_retention: int
    num_lost_to_alignment: int
    num_lost_to_eviction: int
    num_cold_tokens: int
    num_partial_block_copies: int
    num_checkpoints: int = 0
    num_checkpoint_blocks: int = 0
    num_junction_checkpoints: int = 0


@dataclass(slots=True)
class KVTierStats:
    """One KV tier's counters since start (kv/tiers), in blocks and bytes. A lookup asks the
    tiers in turn for each block of a chain: a block found counts a hit for the tier that had
    it and a miss for each tier asked before; the first block no tier has, a miss for each."""

    name: str  # "host" or "disk"
    num_hits: int = 0
    num_misses: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    load_s: float = 0.0  # time spent reading (and checking) blocks
    num_evictions: int = 0  # for room: the byte budget
    num_expired: int = 0  # disk: not used for longer than the TTL
    # disk: a link, a special file, truncated, corrupt, forged, foreign, non-finite or another
    # version: deleted, recomputed
    num_invalid: int = 0
    num_read_failures: int = 0  # disk: reads that failed (I/O) or did not come back in time
    num_blocks: int = 0  # held now (disk: as of the last sweep, plus writes since)
    bytes_used: int = 0
    writes_disabled: bool = False  # disk: read-only or full; reads go on
    reads_disabled: bool = False  # disk: reads kept failing; the tier is off

    def snapshot(self) -> KVTierStats:
        return dataclasses.replace(self)


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
    # Summed over requests since start, in prompt tokens (prefix_cache_hits are the reused).
    num_lost_to_retention: int = 0
    num_lost_to_alignment: int = 0
    num_lost_to_eviction: int = 0
    num_cold_tokens: int = 0
    # Window checkpoints: records kept, and the sliding-group blocks cached for them.
    num_checkpoints: int = 0
    num_checkpoint_blocks: int = 0
    checkpoint_memory_bytes: int = 0
    # Prompt tokens the model computed (cached ones excluded): head + tails when heads are shared.
    num_prefill_tokens: int = 0
    # Requests by where their reuse came from (RequestMetrics.reuse_source), and checkpoints
    # kept at detected junctions; tokens copied into fresh blocks for token-exact reuse.
    reuse_sources: dict[str, int] = field(default_factory=dict)
    num_junction_checkpoints: int = 0
    num_partial_block_copies: int = 0
    num_pinned_blocks: int = 0
    # The tiers below the device pool by name ("host", "disk"); empty when none is on.
    kv_tiers: dict[str, KVTierStats] = field(default_factory=dict)
    # Speculative decoding: request-steps that verified a draft, its tokens, the accepted ones.
    num_spec_verifications: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def spec_acceptance_rate(self) -> float:
        """Accepted draft tokens per draft token verified (0 without speculation)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def spec_tokens_per_verification(self) -> float:
        """Output tokens a verification step made for its request: 1 + accepted per step (the
        mean acceptance length vLLM reports; 0 without speculation)."""
        if not self.num_spec_verifications:
            return 0.0
        return 1 + self.num_accepted_tokens / self.num_spec_verifications

    weights: str = "fp32"  # the linear layers' format (EngineConfig.weights, "auto" resolved)
    kv_cache_dtype: str = "float32"  # EngineConfig.kv_cache_dtype, "auto" resolved

    @property
    def prefix_cache_hit_rate(self) -> float:
        return (
            self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
        )
