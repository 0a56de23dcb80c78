"""The seam between the runner, the models' attention layers and the attention backends.

The runner describes a step's sequences once, whatever the backend: per KV group, the slot of
each new token and one `ScheduledSpan` per sequence (`GroupSpans`). The metadata builder of the
backend it picked at start turns them into that backend's own metadata, and every attention
layer hands its queries and K/V to that metadata (`write_kv`, `attend`) without knowing which
backend planned it (vLLM v1: an AttentionMetadataBuilder per backend).

Backends: the torch path (`torch_metadata.TorchMetadataBuilder`, read by `attention.py`) and
the triton kernels (`kernels/metadata.KernelMetadataBuilder`, read by `kernels/dispatch.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True, slots=True)
class ScheduledSpan:
    """One sequence of the step, as the runner sees it."""

    query_start: int
    query_len: int
    num_computed: int  # tokens already in the cache before this step
    block_ids: list[int]
    # block_ids[0] is the sequence's block number first_block: a sliding layer's table starts
    # at its window (every key it reads is at or after first_block * block_size).
    first_block: int = 0
    # The first position whose window state exists: a bounded replay's resume point (its keys
    # before it were never computed; attention and compressors start there).
    window_start: int = 0


@dataclass(slots=True)
class GroupSpans:
    """A step's sequences in one KV group: where each new token's K/V goes, what each reads."""

    slot_mapping: list[int]
    spans: list[ScheduledSpan]


class AttentionMetadata(Protocol):
    """What an attention layer reads of a step's metadata, whichever backend planned it."""

    slot_mapping: torch.Tensor  # (T,) where each new token's K/V is written
    # Sliding-window layers' own metadata when their cache is a separate (window-sized) group;
    # None: they read the same slots as full layers and the window is applied by mask alone.
    sliding: AttentionMetadata | None

    def write_kv(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> None:
        """Store the step's keys and values (T, n_kv_heads, head_dim) in their slots."""
        ...

    def attend(
        self,
        q: torch.Tensor,  # (T, n_heads, head_dim)
        k: torch.Tensor,  # (T, n_kv_heads, head_dim): this step's keys, already stored
        v: torch.Tensor,
        k_cache: torch.Tensor,  # (num_slots, n_kv_heads, head_dim)
        v_cache: torch.Tensor,
        scale: float,
        window: int | None = None,  # a query at p sees keys in (p - window, p]
    ) -> torch.Tensor:
        """(T, n_heads, head_dim): each sequence's queries over its context."""
        ...


class MetadataBuilder(Protocol):
    """Plans one step's attention metadata for one backend; reused by every layer."""

    def build(self, full: GroupSpans, sliding: GroupSpans | None) -> AttentionMetadata: ...
