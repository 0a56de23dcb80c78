"""KV/state bytes per token, by attention kind, as the engine allocates them (per rank).

The engine's KV memory is two block pools (the model's PagedStateSpec.group_block_bytes): the
"full" group, kept for a whole prefix, and the "sliding" group, a window per running request
plus the window checkpoints the cache keeps. Per kind (each model's spec lists its own:
PagedStateSpec.state_kinds):
- llama family: every layer's K and V, kv_cache_dtype bytes (full).
- Gemma 3: its global layers' K/V (full) and its sliding layers' K/V (sliding).
- DeepSeek-V4 (models/deepseek_v4/state.py; its state is held in the model's dtype): every
  layer's window K=V and, in compressor layers, each token's raw compressor inputs (sliding);
  CSA's entries and indexer keys, one per csa_rate tokens, and HCA's entries, one slot per block
  (full).
A running request holds the blocks of its whole prefix in the full group and of its window in
the sliding group; a window checkpoint is the window's blocks before its position.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from inference.engine.attention.paged_state import StateKind
from inference.engine.distributed.sharding import head_shard
from inference.engine.memory_plan.model_spec import ModelSpec
from inference.engine.memory_plan.weights import Sharding


@dataclass(frozen=True, slots=True)
class KVLayout:
    block_size: int
    dtype: str  # what the state is held in
    kinds: tuple[StateKind, ...]
    group_block_bytes: dict[str, int]  # one block of each group, across its layers
    window: int | None  # the sliding layers' window (None: no sliding group)

    @property
    def window_blocks_per_request(self) -> int:
        """Sliding blocks a decoding request holds: positions (p - W, p] span this many."""
        if self.window is None:
            return 0
        return math.ceil((self.window - 1) / self.block_size) + 1

    @property
    def checkpoint_bytes(self) -> int:
        """One window checkpoint (at a block boundary): the window's blocks before it."""
        if self.window is None:
            return 0
        blocks = math.ceil((self.window - 1) / self.block_size)
        return blocks * self.group_block_bytes["sliding"]

    def request_bytes(self, num_tokens: int, chunk: int = 0) -> int:
        """What one request of num_tokens holds (its prefix, its window, and a prefill chunk's
        extra window blocks when `chunk`)."""
        full = math.ceil(num_tokens / self.block_size) * self.group_block_bytes["full"]
        if self.window is None:
            return full
        window = self.window_blocks_per_request + math.ceil(chunk / self.block_size)
        return full + window * self.group_block_bytes["sliding"]


def kv_layout(
    spec: ModelSpec, kv_dtype: torch.dtype, block_size: int, sharding: Sharding
) -> KVLayout:
    """Rank `sharding.rank`'s KV layout. `kv_dtype`: the dtype the cache is held in (V4: the
    model's dtype, whatever kv_cache_dtype says: the caller resolves it as the engine does)."""
    config = spec.config
    if spec.arch != "deepseek_v4" and sharding.world_size > 1:  # KV heads split (sharding.py)
        heads = head_shard(
            config.num_heads, config.num_kv_heads, sharding.rank, sharding.world_size
        )
        config = dataclasses.replace(
            config, num_heads=len(heads.q_heads), num_kv_heads=len(heads.kv_heads)
        )
    state = config.paged_state_spec()
    scale = kv_dtype.itemsize / 4  # the engine's sizes count fp32
    blocks = {
        group: int(size * scale) for group, size in state.group_block_bytes(block_size).items()
    }
    kinds = state.state_kinds(block_size, kv_dtype.itemsize)
    has_window = "sliding" in blocks
    window = int(state.sliding_window) if has_window else None
    return KVLayout(block_size, str(kv_dtype)[6:], kinds, blocks, window)
