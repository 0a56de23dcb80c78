"""GroupIO: one KV cache group as the tiers see it (its block layout, its manager, and the
runner's copies of its blocks out of and into the device cache)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from inference.engine.kv.single_type_kv_cache_manager import FullAttentionManager
from inference.engine.kv.sliding_window_manager import SlidingWindowManager
from inference.engine.kv.tiers.block_file import BlockLayout


@dataclass(frozen=True, slots=True)
class GroupIO:
    layout: BlockLayout
    manager: FullAttentionManager | SlidingWindowManager
    read_blocks: Callable[[list[int]], torch.Tensor]
    write_blocks: Callable[[list[int], torch.Tensor], None]
