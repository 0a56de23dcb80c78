"""Per-step metadata of the kernel path: block tables and lengths, built once per step by the
runner's KernelMetadataBuilder from its scheduled sequences and reused by every layer. Plain
torch: importing it does not import triton (the kernels are imported when a layer first attends).

A step's sequences split in two: those with one new token (decode: the split-K kernel, one
query row per sequence) and the rest (prefill chunks over a cached prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.engine.attention.attention_backend import GroupSpans, ScheduledSpan


@dataclass(slots=True)
class DecodeBatch:
    query_rows: torch.Tensor  # (B,) row of each sequence's query in the flattened batch
    block_tables: torch.Tensor  # (B, max_blocks) int32
    seq_lens: torch.Tensor  # (B,) int32, the query token included; 0 = a padded row
    max_seq_len: int  # bound on seq_lens: sizes the grid (fixed for a CUDA graph)
    first_blocks: torch.Tensor | None = None  # (B,) block index of each table's first entry


@dataclass(slots=True)
class PrefillBatch:
    query_starts: torch.Tensor  # (B,) first row of each sequence's new tokens
    query_lens: torch.Tensor  # (B,)
    block_tables: torch.Tensor  # (B, max_blocks) int32
    seq_lens: torch.Tensor  # (B,) int32, this step's tokens included
    max_query_len: int
    first_blocks: torch.Tensor | None = None  # (B,) block index of each table's first entry


@dataclass(slots=True)
class KernelMetadata:
    block_size: int
    decode: DecodeBatch | None
    prefill: PrefillBatch | None
    window: int | None = None  # set on the metadata of sliding-window layers


@dataclass(slots=True)
class KernelAttentionMetadata:
    """The kernel path's metadata of a step: where the new K/V go, and the kernels' tables."""

    slot_mapping: torch.Tensor  # (T,) where each new token's K/V is written; -1: padding
    tables: KernelMetadata
    # Sliding-window layers' own metadata when their cache is a separate (window-sized) group.
    sliding: KernelAttentionMetadata | None = None

    def write_kv(self, k, v, k_cache, v_cache) -> None:
        from inference.engine.kernels.store_kv import store_kv

        store_kv(k, v, k_cache, v_cache, self.slot_mapping)

    def attend(self, q, k, v, k_cache, v_cache, scale: float, window: int | None = None):
        from inference.engine.kernels import dispatch

        return dispatch.attend(q, k_cache, v_cache, self.tables, scale, window)


class KernelMetadataBuilder:
    """Plans the kernel path's metadata of a step from its spans (one builder per runner)."""

    def __init__(
        self, block_size: int, device: torch.device, *, sliding_window: int | None = None
    ) -> None:
        self.block_size = block_size
        self.device = device
        self.sliding_window = sliding_window

    def build(self, full: GroupSpans, sliding: GroupSpans | None) -> KernelAttentionMetadata:
        meta = KernelAttentionMetadata(
            torch.tensor(full.slot_mapping, device=self.device),
            build_kernel_metadata(full.spans, self.block_size, self.device),
        )
        if sliding is not None:
            meta.sliding = KernelAttentionMetadata(
                torch.tensor(sliding.slot_mapping, device=self.device),
                build_kernel_metadata(
                    sliding.spans, self.block_size, self.device, window=self.sliding_window
                ),
            )
        return meta


def build_kernel_metadata(
    spans: list[ScheduledSpan], block_size: int, device: torch.device, window: int | None = None
) -> KernelMetadata:
    decode = [s for s in spans if s.query_len == 1]
    prefill = [s for s in spans if s.query_len > 1]
    # Every index tensor of the step goes to the device in one copy, then is cut into views.
    host: list[int] = []
    layout: list[tuple[int, ...]] = []

    def add(rows: list[list[int]]) -> None:
        width = max(len(row) for row in rows)
        for row in rows:
            host.extend(row + [0] * (width - len(row)))
        layout.append((len(rows), width))

    for group in (decode, prefill):
        if not group:
            continue
        add([[s.query_start for s in group]])
        add([[s.query_len for s in group]])
        add([[s.num_computed + s.query_len for s in group]])  # seq_lens
        add([s.block_ids for s in group])
        if any(s.first_block for s in group):
            add([[s.first_block for s in group]])
    flat = torch.tensor(host, dtype=torch.int32).to(device)
    views, cursor = [], 0
    for rows, width in layout:
        views.append(flat[cursor : cursor + rows * width].view(rows, width))
        cursor += rows * width
    views.reverse()

    def batch_views(group):
        starts, lens, seq_lens, tables = (views.pop()[0], views.pop()[0], views.pop()[0],
                                          views.pop())  # fmt: skip
        firsts = views.pop()[0] if any(s.first_block for s in group) else None
        return starts, lens, seq_lens, tables, firsts

    decode_batch = prefill_batch = None
    if decode:
        rows, _, seq_lens, tables, firsts = batch_views(decode)
        max_seq_len = max(s.num_computed + 1 for s in decode)
        decode_batch = DecodeBatch(rows, tables, seq_lens, max_seq_len, firsts)
    if prefill:
        starts, lens, seq_lens, tables, firsts = batch_views(prefill)
        max_query_len = max(s.query_len for s in prefill)
        prefill_batch = PrefillBatch(starts, lens, tables, seq_lens, max_query_len, firsts)
    return KernelMetadata(block_size, decode_batch, prefill_batch, window)
