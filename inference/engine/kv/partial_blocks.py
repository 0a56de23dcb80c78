"""Token-exact reuse inside a block: find the cached block a match continues into, and the
copy-on-write record that gives the new request its own copy of the matching slots.

Only full blocks are hash-chained, so a prompt that matches a cached one up to position P
inside block j finds block j through the children index (the cached blocks whose chain parent
is block j - 1), comparing tokens. Its first P mod B slots are then copied into a fresh block
of the new request before the step's forward; the cached block itself is never written, so
other requests sharing it see no change. A block cached in the current step is written by this
step's forward, after the copies run, so it is not a source until the next step.
"""

from __future__ import annotations

from dataclasses import dataclass

from inference.engine.kv.block_pool import BlockPool, KVCacheBlock
from inference.engine.kv.hashing import BlockHash


@dataclass(slots=True)
class PartialBlock:
    """The reuse point P lies inside a block: copy the first `num_slots` slots of these cached
    blocks (one per KV cache group) into the request's fresh block at index P // block_size."""

    sources: tuple[KVCacheBlock, ...]
    num_slots: int


@dataclass(slots=True)
class BlockCopy:
    group: str  # the KV cache group's kind: "full" or "sliding"
    src_block_id: int
    dst_block_id: int
    num_slots: int


def matching_children(
    pool: BlockPool, parent: BlockHash, tail: list[int]
) -> list[tuple[KVCacheBlock, int]]:
    """(block, matching tokens) for each cached block continuing `parent` that starts like
    `tail` (the request's tokens after the chain)."""
    found = []
    for child in pool.cached_children(parent):
        common = 0
        limit = min(len(tail), len(child.token_ids))  # a cached partial tail is shorter
        while common < limit and child.token_ids[common] == tail[common]:
            common += 1
        if common:
            found.append((child, common))
    return found


def partial_source(
    pool: BlockPool,
    chain: list[KVCacheBlock],
    children: list[tuple[KVCacheBlock, int]],
    position: int,
    block_size: int,
) -> KVCacheBlock | None:
    """The full group's source of a reuse point inside a block, if computed before this step:
    a chain block (the point is capped before the prompt's last token) or a matching child
    (on a hybrid model, the children are narrowed to the one keying the window checkpoint)."""
    index, offset = divmod(position, block_size)
    if index < len(chain):
        source = chain[index]
    else:
        matches = [block for block, n in children if n >= offset and pool.is_ready(block)]
        source = matches[0] if matches else None
    if source is None or not pool.is_ready(source):
        return None
    return source
