"""Small helpers shared by the engine tests."""

from __future__ import annotations

import random

import torch

from inference.engine.attention.attention_backend import GroupSpans, ScheduledSpan
from inference.engine.config import CacheConfig, SchedulerConfig
from inference.engine.core.scheduler import Scheduler
from inference.engine.kv.kv_cache_manager import KVCacheManager, KVCacheSpec


def random_tokens(rng: random.Random, n: int) -> list[int]:
    """n token ids from the middle of Gemma's vocabulary (no special tokens)."""
    return [rng.randrange(1000, 200_000) for _ in range(n)]


def smollm2_tokens(rng: random.Random, n: int) -> list[int]:
    """n ids from the middle of SmolLM2's vocabulary (also deepseek-v4-tiny-random's)."""
    return [rng.randrange(1000, 49_000) for _ in range(n)]


# vLLM's rounding (blocks and the retention grid): no partial-block copy, no junctions, no
# shared prefill; the talk's numbers come out under it.
ROUNDING = dict(
    enable_partial_block_reuse=False, enable_junction_checkpoints=False, enable_shared_prefill=False
)


# What the cache and scheduler tests assume unless they say otherwise: block-rounded reuse
# without junction checkpoints, no shared prefill, no jump-forward.
TINY_CACHE = dict(enable_partial_block_reuse=False, enable_junction_checkpoints=False)
TINY_SCHEDULER = dict(enable_shared_prefill=False, enable_jump_forward=False)


def tiny_kv_cache_manager(
    num_blocks: int,
    block_size: int,
    *,
    sliding_window: int | None = None,
    num_sliding_blocks: int | None = None,
    **cache_fields,
) -> KVCacheManager:
    """A KV cache manager for the model fingerprint "test": `cache_fields` are CacheConfig's,
    over TINY_CACHE; a `sliding_window` adds the sliding group."""
    cache = CacheConfig(block_size=block_size, **{**TINY_CACHE, **cache_fields})
    return KVCacheManager(
        cache, KVCacheSpec(num_blocks, "test", sliding_window, num_sliding_blocks)
    )


def tiny_scheduler(
    manager: KVCacheManager,
    *,
    tokenizer=None,
    drafter=None,
    num_speculative_tokens: int = 0,
    **scheduler_fields,
) -> Scheduler:
    """A scheduler over `manager`: `scheduler_fields` are SchedulerConfig's, over TINY_SCHEDULER."""
    config = SchedulerConfig(**{**TINY_SCHEDULER, **scheduler_fields})
    return Scheduler(
        config,
        manager,
        tokenizer=tokenizer,
        drafter=drafter,
        num_speculative_tokens=num_speculative_tokens,
    )


def accounted(metrics) -> int:
    """The prompt tokens a request's reuse accounting covers: they must add up to the prompt."""
    return (
        metrics.num_cached_tokens
        + metrics.num_lost_to_retention
        + metrics.num_lost_to_alignment
        + metrics.num_lost_to_eviction
        + metrics.num_cold_tokens
    )


def v4_one_pass(model, ids: list[int], rows: list[int], block_size: int = 16, **kwargs):
    """A DeepSeek-V4 model over `ids` in one step on fresh state of its own: the logits of
    `rows` (with keep_for_draft=True, also what its MTP layer reads)."""
    n = len(ids)
    num_blocks = -(-n // block_size)
    spec = model.config.paged_state_spec()
    state = spec.allocate(num_blocks, num_blocks, block_size, torch.float32, torch.device("cpu"))
    blocks = list(range(num_blocks))
    full = GroupSpans(list(range(n)), [ScheduledSpan(0, n, 0, blocks)])
    window = GroupSpans(list(range(n)), [ScheduledSpan(0, n, 0, blocks, first_block=0)])
    meta = spec.metadata_builder(block_size, torch.device("cpu")).build(full, window)
    output = model(
        torch.tensor(ids), torch.arange(n), state.layers, meta, torch.tensor(rows), **kwargs
    )
    return output, state
