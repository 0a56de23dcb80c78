"""The torch path's attention metadata and its builder: which cached slots each sequence reads
in place and which it gathers, the head that decoding sequences share, and the decode windows.

A sequence's cached context is listed as runs of consecutive slots: long runs are read in place
(views), short scattered ones gathered once (`plan_span`). Leading blocks that every one-token
sequence shares are read once for all of them (`plan_shared_prefix`), unless the decode windows
(decode_windows.py) already read the decoding sequences together. A hybrid model's sliding
layers get their own metadata over their group's window blocks, each span recording the
position its listed context starts at.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.engine.attention.attention import paged_attention, write_kv
from inference.engine.attention.attention_backend import GroupSpans, ScheduledSpan
from inference.engine.attention.block_runs import block_runs, first_difference
from inference.engine.attention.decode_windows import DecodeBatch, plan_decode_batch, slot_runs

# Runs shorter than this are gathered together instead of getting an attention call each.
MIN_VIEW_SLOTS = 64


@dataclass(slots=True)
class SequenceSpan:
    query_start: int  # first row of this sequence in the flattened batch
    query_len: int  # new tokens this step
    # Context read from the cache. With one new token it includes that token (already written
    # this layer), so a decode step needs no causal part; otherwise the new tokens come after.
    num_cached: int
    view_runs: list[tuple[int, int]]  # [start, end) slot ranges read in place
    gathered_slots: torch.Tensor | None  # the rest of the cached context's slots
    # Positions, read only by the sliding-window path: the listed context covers positions
    # [cached_start, num_cached) in block order; each view run starts at its view_position.
    cached_start: int = 0
    view_positions: list[int] | None = None


@dataclass(slots=True)
class SharedPrefix:
    """Cached slots that several one-token spans all start with, read once for all of them.

    A tick's decisions share a long head; in a decode step each would otherwise read the same
    K/V from memory once per sequence (the cascade idea of FlashInfer, on the CPU).
    """

    span_indices: list[int]
    view_runs: list[tuple[int, int]]
    gathered_slots: torch.Tensor | None
    # For the sliding-window path: the prefix's length and its view runs' offsets in it; it
    # ends where each of its spans' own listed context starts.
    num_slots: int = 0
    view_offsets: list[int] | None = None


@dataclass(slots=True)
class TorchAttentionMetadata:
    """The torch path's metadata of a step (see attention.py for how it is read)."""

    slot_mapping: torch.Tensor  # (T,) where each new token's K/V is written
    spans: list[SequenceSpan]
    shared: SharedPrefix | None = None
    # Sliding-window layers' own metadata when their cache is a separate (window-sized) group;
    # None: they read the same slots as full layers and the window is applied by mask alone.
    sliding: TorchAttentionMetadata | None = None
    # The one-token spans read together, window by window (decode_windows.py); set on the full
    # layers' metadata and, cut to the window, on the sliding layers'.
    decode: DecodeBatch | None = None

    def write_kv(self, k, v, k_cache, v_cache) -> None:
        write_kv(k, v, k_cache, v_cache, self.slot_mapping)

    def attend(self, q, k, v, k_cache, v_cache, scale: float, window: int | None = None):
        return paged_attention(q, k, v, k_cache, v_cache, self, scale, window)


def plan_span(
    query_start: int,
    query_len: int,
    block_ids: list[int],
    num_cached: int,
    block_size: int,
    device: torch.device,
    skip_blocks: int = 0,
    first_position: int = 0,
) -> SequenceSpan:
    """Split the cached-context slots (after `skip_blocks` shared blocks) into in-place runs and
    a gathered remainder.

    `num_cached` is the position of the first new token; `block_ids[0]` holds positions from
    `first_position` on (0, unless a sliding layer's cache keeps only the window's blocks).
    """
    if query_len == 1:
        num_cached += 1
    if first_position % block_size or not 0 <= first_position <= num_cached:
        raise ValueError(
            f"first_position {first_position} must be a multiple of block_size ({block_size}) "
            f"within the context (0..{num_cached})"
        )
    num_blocks = -(-(num_cached - first_position) // block_size)
    last_len = (
        num_cached - first_position - (num_blocks - 1) * block_size
        if num_blocks > skip_blocks
        else 0
    )
    cached_start = first_position + skip_blocks * block_size
    view_runs, view_offsets, gathered = _split_runs(
        block_ids[skip_blocks:num_blocks], block_size, last_len, device
    )
    view_positions = [cached_start + offset for offset in view_offsets]
    return SequenceSpan(
        query_start, query_len, num_cached, view_runs, gathered, cached_start, view_positions
    )


def plan_shared_prefix(
    decode_blocks: dict[int, list[int]],
    num_full_blocks: dict[int, int],
    block_size: int,
    device: torch.device,
) -> tuple[SharedPrefix, int] | None:
    """The longest run of leading blocks that every one-token span (≥ 2 of them) shares,
    and its length in blocks."""
    if len(decode_blocks) < 2:
        return None
    lists = list(decode_blocks.values())
    limit = min(num_full_blocks.values())
    common = first_difference(lists, limit)
    if common * block_size < MIN_VIEW_SLOTS:
        return None
    view_runs, offsets, gathered = _split_runs(lists[0][:common], block_size, block_size, device)
    shared = SharedPrefix(sorted(decode_blocks), view_runs, gathered, common * block_size, offsets)
    return shared, common


def _split_runs(
    block_ids: list[int], block_size: int, last_len: int, device: torch.device
) -> tuple[list[tuple[int, int]], list[int], torch.Tensor | None]:
    """Slot ranges of consecutive blocks (the last block holding `last_len` slots): long ones
    are read in place (returned with their offsets in the listed context), the short rest
    gathered once."""
    runs = [
        (block_ids[i] * block_size, (block_ids[j - 1] + 1) * block_size)
        for i, j in block_runs(block_ids)
    ]
    if runs and last_len < block_size:
        runs[-1] = (runs[-1][0], runs[-1][1] - block_size + last_len)
    view_runs, view_offsets, rest = [], [], []
    offset = 0
    for a, b in runs:
        if b - a >= MIN_VIEW_SLOTS:
            view_runs.append((a, b))
            view_offsets.append(offset)
        else:
            rest.extend(range(a, b))
        offset += b - a
    gathered = torch.tensor(rest, dtype=torch.long, device=device) if rest else None
    return view_runs, view_offsets, gathered


class TorchMetadataBuilder:
    """Plans the torch path's metadata of a step from its spans (one builder per runner)."""

    def __init__(
        self,
        block_size: int,
        device: torch.device,
        *,
        sliding_window: int | None = None,
        decode_windows: bool = True,
    ) -> None:
        self.block_size = block_size
        self.device = device
        self.sliding_window = sliding_window
        self.decode_windows = decode_windows

    def build(self, full: GroupSpans, sliding: GroupSpans | None) -> TorchAttentionMetadata:
        decode = self._decode_batch(full.spans) if self.decode_windows else None
        # The decode windows read a head shared by the decoding sequences once already.
        shared = None if decode else self._shared_prefix(full.spans)
        spans = [
            plan_span(
                s.query_start,
                s.query_len,
                s.block_ids,
                s.num_computed,
                self.block_size,
                self.device,
                skip_blocks=shared[1] if shared and index in shared[0].span_indices else 0,
            )
            for index, s in enumerate(full.spans)
        ]
        meta = TorchAttentionMetadata(
            torch.tensor(full.slot_mapping, device=self.device),
            spans,
            shared[0] if shared else None,
            decode=decode,
        )
        if sliding is not None:
            meta.sliding = self._sliding(sliding)
        return meta

    def _sliding(self, group: GroupSpans) -> TorchAttentionMetadata:
        """Spans over each sequence's window blocks in the sliding group."""
        size = self.block_size
        spans = [
            plan_span(
                s.query_start,
                s.query_len,
                s.block_ids,
                s.num_computed,
                size,
                self.device,
                first_position=s.first_block * size,
            )
            for s in group.spans
        ]
        decode = (
            self._decode_batch(group.spans, self.sliding_window) if self.decode_windows else None
        )
        return TorchAttentionMetadata(
            torch.tensor(group.slot_mapping, device=self.device), spans, decode=decode
        )

    def _decode_batch(
        self, spans: list[ScheduledSpan], window: int | None = None
    ) -> DecodeBatch | None:
        """The one-token sequences of this step and the slots of their contexts (their new
        token's included: it is written before attention reads). With a `window`, the
        sliding group's: each sequence's window blocks, from position p - W + 1 on."""
        indices, rows, runs = [], [], []
        for index, span in enumerate(spans):
            if span.query_len == 1:
                num_slots = span.num_computed + 1
                indices.append(index)
                rows.append(span.query_start)
                lowest = 0 if window is None else max(0, num_slots - window)
                runs.append(
                    slot_runs(span.block_ids, num_slots, self.block_size, span.first_block, lowest)
                )
        return plan_decode_batch(indices, rows, runs, self.device, window)

    def _shared_prefix(self, spans: list[ScheduledSpan]) -> tuple[SharedPrefix, int] | None:
        """Leading cached blocks shared by the decoding sequences of this step, if any."""
        decode_blocks, num_full = {}, {}
        for index, span in enumerate(spans):
            if span.query_len == 1:
                decode_blocks[index] = span.block_ids
                # Blocks before the one that receives this step's token.
                num_full[index] = span.num_computed // self.block_size
        return plan_shared_prefix(decode_blocks, num_full, self.block_size, self.device)
