"""Plain paged K/V (llama family, Gemma 3): each layer's K and V per token, in the slots of its
group's blocks (the PagedStateSpec of attention/paged_state.py).

The KV cache of every layer is a view of one stacked tensor (num_layers, 2, num_slots,
n_kv_heads, head_dim) whose rows hold the layers group by group (full, then sliding), so a copy
of slots (copy-on-write, window checkpoints) is one call for all the layers of a group
(copy_slots). A hybrid model's layers come in two KV groups: full-attention layers index the
full group's slots, sliding-window layers their own (smaller in use, not in size) sliding
group's. Both groups have num_blocks blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from inference.engine.attention.attention_backend import MetadataBuilder
from inference.engine.attention.paged_state import DType, StateKind
from inference.engine.attention.torch_metadata import TorchMetadataBuilder
from inference.engine.kernels.metadata import KernelMetadataBuilder
from inference.engine.kernels.reference import copy_slots_reference
from inference.engine.kv.partial_blocks import BlockCopy

KINDS = ("full", "sliding")


@dataclass(frozen=True, slots=True)
class PagedKVSpec:
    """K and V per token in every layer, in its kind's group; both groups have the same
    number of blocks (num_window_blocks is not a budget of its own here)."""

    layer_types: tuple[str, ...]  # "full" | "sliding" per layer
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None

    has_attention_kernels = True
    has_window_budget = False
    replay_alignment = None
    kv_tiers_unsupported = None

    @property
    def kv_groups(self) -> tuple[str, ...]:
        return tuple(kind for kind in KINDS if kind in self.layer_types)

    @property
    def can_capture_cuda_graphs(self) -> bool:
        # A graph records one set of block tables; sliding-window layers with their own window
        # tables (hybrid models) would need a second set, not recorded yet: those run eagerly.
        return "sliding" not in self.kv_groups

    def group_block_bytes(self, block_size: int) -> dict[str, int]:
        per_layer = block_size * 2 * self.num_kv_heads * self.head_dim * 4  # fp32 K and V
        return {kind: per_layer * self.layer_types.count(kind) for kind in self.kv_groups}

    def state_kinds(self, block_size: int, itemsize: int) -> tuple[StateKind, ...]:
        per_layer = 2 * self.num_kv_heads * self.head_dim * itemsize  # K and V
        counts = {kind: self.layer_types.count(kind) for kind in self.kv_groups}
        return tuple(
            StateKind(f"{kind} attention K/V ({count} layers)", kind, per_layer * count)
            for kind, count in counts.items()
        )

    def state_dtype(self, dtype: DType, kv_cache_dtype: DType) -> DType:
        return kv_cache_dtype

    def allocate(
        self,
        num_blocks: int,
        num_window_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> PagedKVCache:
        return PagedKVCache(self, num_blocks, block_size, dtype, device)

    def metadata_builder(
        self,
        block_size: int,
        device: torch.device,
        *,
        use_kernels: bool = False,
        decode_windows: bool = True,
    ) -> MetadataBuilder:
        if use_kernels:
            return KernelMetadataBuilder(block_size, device, sliding_window=self.sliding_window)
        return TorchMetadataBuilder(
            block_size, device, sliding_window=self.sliding_window, decode_windows=decode_windows
        )


class PagedKVCache:
    """The stacked K/V tensor (`cache`), each layer's (K, V) views (`layers`) and each group's
    rows (`group_caches`); its copies, and the block reads and writes of the KV tiers."""

    mtp_layer = None

    def __init__(
        self,
        spec: PagedKVSpec,
        num_blocks: int,  # of each group
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.block_size = block_size
        self.device = device
        self.cache, self.layers, self.group_caches = allocate_kv_cache(
            spec.layer_types,
            num_blocks * block_size,
            spec.num_kv_heads,
            spec.head_dim,
            dtype,
            device,
        )
        if device.type == "cuda":
            from inference.engine.kernels.copy_slots import copy_slots
        else:
            copy_slots = copy_slots_reference  # the same torch ops, without importing triton
        self._copy_slots = copy_slots

    def copy_blocks(self, copies: Sequence[BlockCopy]) -> None:
        """Each record's first `num_slots` slots, in every layer of its group (full or
        sliding): one copy_slots per group."""
        size = self.block_size
        for group, cache in self.group_caches.items():
            mine = [c for c in copies if c.group == group]
            if not mine:
                continue
            src = [c.src_block_id * size + i for c in mine for i in range(c.num_slots)]
            dst = [c.dst_block_id * size + i for c in mine for i in range(c.num_slots)]
            self._copy_slots(cache, self._index(src), self._index(dst))

    def read_blocks(self, group: str, block_ids: list[int]) -> torch.Tensor:
        """A copy of these blocks' K/V in every layer of the group, on the CPU:
        (num_group_layers * 2, len(block_ids) * block_size, n_kv_heads, head_dim)."""
        cache = self.group_caches[group]
        return cache.index_select(1, self._block_slots(block_ids)).to("cpu")

    def write_blocks(self, group: str, block_ids: list[int], payload: torch.Tensor) -> None:
        """Put K/V read by read_blocks (same shape) into these blocks of the group."""
        cache = self.group_caches[group]
        slots = self._block_slots(block_ids)
        cache.index_copy_(1, slots, payload.to(device=cache.device, dtype=cache.dtype))

    def block_shape(self, group: str) -> tuple[int, ...]:
        """One block's K/V in a group, as read_blocks gives it for one block."""
        rows, _, n_kv_heads, head_dim = self.group_caches[group].shape
        return (rows, self.block_size, n_kv_heads, head_dim)

    def _block_slots(self, block_ids: list[int]) -> torch.Tensor:
        size = self.block_size
        return self._index([block_id * size + i for block_id in block_ids for i in range(size)])

    def _index(self, slots: list[int]) -> torch.Tensor:
        return torch.tensor(slots, dtype=torch.long, device=self.device)


def allocate_kv_cache(
    layer_types: tuple[str, ...],
    num_slots: int,
    n_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], dict[str, torch.Tensor]]:
    """The stacked cache (num_layers, 2, num_slots, n_kv_heads, head_dim), its rows the full
    layers then the sliding ones; each layer's (K, V) views, in layer order; and each group's
    rows as one (num_group_layers * 2, num_slots, n_kv_heads, head_dim) view, for copy_slots."""
    cache = torch.zeros(
        (len(layer_types), 2, num_slots, n_kv_heads, head_dim), dtype=dtype, device=device
    )
    rows = sorted(range(len(layer_types)), key=lambda layer: layer_types[layer] != "full")
    row_of = {layer: row for row, layer in enumerate(rows)}
    per_layer = [(cache[row_of[i], 0], cache[row_of[i], 1]) for i in range(len(layer_types))]
    num_full = layer_types.count("full")
    groups = {"full": cache[:num_full], "sliding": cache[num_full:]}
    per_group = {name: part.flatten(0, 1) for name, part in groups.items() if part.shape[0]}
    return cache, per_layer, per_group
