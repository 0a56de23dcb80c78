"""Small helpers shared by the engine tests."""

from __future__ import annotations

import random

import torch

from inference.engine.attention.attention_backend import GroupSpans, ScheduledSpan


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
