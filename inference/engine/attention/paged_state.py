"""The seam between the engine and a model's paged attention state (vLLM v1's KVCacheSpec).

Every model config says what its paged state is (`config.paged_state_spec()`, a
`PagedStateSpec`): the kind of each layer, the KV groups the coordinator manages and the bytes
one block of each holds, the dtype the state is held in, and how to allocate it and plan a
step's metadata over it. The engine sizes its block pools from the spec and the runner
allocates and plans through it; neither knows which model it runs.

Two kinds so far: plain paged K/V per token and layer (attention/paged_kv.py: llama family,
Gemma 3) and DeepSeek-V4's windows and compressed entries (models/deepseek_v4/state_spec.py).
A new kind of state is a new spec, never a branch in the engine or the runner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

from inference.engine.attention.attention_backend import MetadataBuilder
from inference.engine.kv.partial_blocks import BlockCopy

DType = TypeVar("DType", str, torch.dtype)  # a dtype's name (config) or the dtype itself


@dataclass(frozen=True, slots=True)
class StateKind:
    """One kind of per-token state: its bytes per token (per rank) and the group holding it."""

    name: str
    group: str  # "full" | "sliding"
    bytes_per_token: float


class PagedState(Protocol):
    """A model's paged state on the device, as the runner holds it."""

    # Each layer's view of the state, in layer order: what the model's forward reads.
    layers: list[Any]
    # The MTP layer's own state (a model with one: `model.has_mtp`), or None.
    mtp_layer: Any

    def copy_blocks(self, copies: Sequence[BlockCopy]) -> None:
        """Copy-on-write of partial blocks: each copy's first num_slots slots of its group,
        from its source block to its destination; every source is read before any write."""
        ...

    # The KV tiers' reads and writes (kv/tiers): a block's state as one payload whose dim 1
    # has block_size rows (the tiers cut and join payloads there), on the CPU.

    def read_blocks(self, group: str, block_ids: list[int]) -> torch.Tensor:
        """A copy of these blocks' state in the group: block i is [:, i*B:(i+1)*B]."""
        ...

    def write_blocks(self, group: str, block_ids: list[int], payload: torch.Tensor) -> None:
        """Put what read_blocks gave (same shape) into these blocks of the group."""
        ...

    def block_shape(self, group: str) -> tuple[int, ...]:
        """One block's payload in a group, as read_blocks gives it for one block."""
        ...


class PagedStateSpec(Protocol):
    """What a model's paged state is, from its config alone (no weights, no device)."""

    layer_types: tuple[str, ...]  # each layer's attention kind
    kv_groups: tuple[str, ...]  # "full" (hash-chained, the whole prefix) and maybe "sliding"
    sliding_window: int | None  # the window the "sliding" group holds (None: no such group)
    has_attention_kernels: bool  # the triton backend has kernels for this state
    # Its kernel path's decode steps can be recorded as CUDA graphs (runner/cuda_graphs.py):
    # fixed grids over one set of block tables. Otherwise decode runs eagerly (a log line says).
    can_capture_cuda_graphs: bool
    # The window (sliding) group may have a budget of its own (window_cache_fraction,
    # num_window_blocks); otherwise both groups have the same number of blocks.
    has_window_budget: bool
    # Where a bounded replay may start (a multiple of every compression rate), or None: the
    # state has nothing compressed to replay over.
    replay_alignment: int | None
    # Why the KV tiers cannot store this state, or None when they can.
    kv_tiers_unsupported: str | None

    def group_block_bytes(self, block_size: int) -> dict[str, int]:
        """fp32 bytes one block of each KV group holds across its layers."""
        ...

    def state_kinds(self, block_size: int, itemsize: int) -> tuple[StateKind, ...]:
        """Each kind of state a token holds, held at `itemsize` bytes an element (what the
        memory plan reports; they add up to group_block_bytes at that itemsize)."""
        ...

    def state_dtype(self, dtype: DType, kv_cache_dtype: DType) -> DType:
        """The dtype the state is held in, for a model running in `dtype` asked for
        `kv_cache_dtype`."""
        ...

    def allocate(
        self,
        num_blocks: int,  # the full group's
        num_window_blocks: int,  # the sliding group's
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> PagedState: ...

    def metadata_builder(
        self,
        block_size: int,
        device: torch.device,
        *,
        use_kernels: bool = False,  # the triton backend (only where has_attention_kernels)
        decode_windows: bool = True,  # the torch path's decoding sequences read together
    ) -> MetadataBuilder: ...
