"""EngineStats: one snapshot assembled from the components' own (the scheduler's, the KV cache
manager's, the pinned heads', the KV tiers'; each makes its own, as vLLM's make_stats()) and
from what only the engine counts. Callers get the snapshot, never the live components.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inference.engine.metrics import EngineStats

if TYPE_CHECKING:
    from inference.engine.core.engine_builder import EngineParts


def make_engine_stats(parts: EngineParts, *, num_queued: int, num_steps: int) -> EngineStats:
    """`num_queued`: requests handed in but not yet given to the scheduler (counted as
    waiting); `num_steps`: the steps the engine has run."""
    scheduler = parts.scheduler.make_stats()
    cache = parts.kv_cache_manager.make_stats()
    offloader = parts.offloader
    return EngineStats(
        prefix_cache_queries=cache.prefix_cache_queries,
        prefix_cache_hits=cache.prefix_cache_hits,
        kv_cache_usage=cache.usage,
        num_running=scheduler.num_running,
        num_waiting=scheduler.num_waiting + num_queued,
        num_preemptions=scheduler.num_preemptions,
        num_steps=num_steps,
        num_forced_tokens=scheduler.num_forced_tokens,
        num_lost_to_retention=cache.num_lost_to_retention,
        num_lost_to_alignment=cache.num_lost_to_alignment,
        num_lost_to_eviction=cache.num_lost_to_eviction,
        num_cold_tokens=cache.num_cold_tokens,
        num_checkpoints=cache.num_checkpoints,
        num_checkpoint_blocks=cache.num_checkpoint_blocks,
        checkpoint_memory_bytes=cache.num_checkpoint_blocks * parts.sliding_block_bytes,
        num_prefill_tokens=scheduler.num_prefill_tokens,
        reuse_sources=scheduler.reuse_sources,
        num_junction_checkpoints=cache.num_junction_checkpoints,
        num_partial_block_copies=cache.num_partial_block_copies,
        num_pinned_blocks=parts.pinned.num_pinned_blocks(),
        kv_tiers=offloader.make_stats() if offloader is not None else {},
        num_spec_verifications=scheduler.num_spec_verifications,
        num_draft_tokens=scheduler.num_draft_tokens,
        num_accepted_tokens=scheduler.num_accepted_tokens,
        weights=parts.weights,
        kv_cache_dtype=parts.kv_cache_dtype,
    )
