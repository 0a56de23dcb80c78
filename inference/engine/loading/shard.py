"""Which share of a checkpoint a rank reads under expert parallelism (models that split their
experts at load take it; the others load whole and are split after, distributed.sharding)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Shard:
    """Expert parallelism at load: this rank keeps experts balanced_range(E, rank, world_size)
    of each main layer (the MTP layer's experts stay whole)."""

    rank: int
    world_size: int
