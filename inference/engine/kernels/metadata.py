"""Per-step metadata of the kernel path: block tables and lengths, built once per step by the
runner from its scheduled sequences and reused by every layer. Plain torch: importing it does
not import triton.

A step's sequences split in two: those with one new token (decode: the split-K kernel, one
query row per sequence) and the rest (prefill chunks over a cached prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class DecodeBatch:
    query_rows: torch.Tensor  # (B,) row of each sequence's query in the flattened batch
    block_tables: torch.Tensor  # (B, max_blocks) int32
    seq_lens: torch.Tensor  # (B,) int32, the query token included; 0 = a padded row
    max_seq_len: int  # bound on seq_lens: sizes the grid (fixed for a CUDA graph)


@dataclass(slots=True)
class PrefillBatch:
    query_starts: torch.Tensor  # (B,) first row of each sequence's new tokens
    query_lens: torch.Tensor  # (B,)
    block_tables: torch.Tensor  # (B, max_blocks) int32
    seq_lens: torch.Tensor  # (B,) int32, this step's tokens included
    max_query_len: int


@dataclass(slots=True)
class KernelMetadata:
    block_size: int
    decode: DecodeBatch | None
    prefill: PrefillBatch | None
    window: int | None = None  # set on the metadata of sliding-window layers


@dataclass(frozen=True, slots=True)
class ScheduledSpan:
    """One sequence of the step, as the runner sees it."""

    query_start: int
    query_len: int
    num_computed: int  # tokens already in the cache before this step
    block_ids: list[int]


def build_kernel_metadata(
    spans: list[ScheduledSpan], block_size: int, device: torch.device, window: int | None = None
) -> KernelMetadata:
    decode = [s for s in spans if s.query_len == 1]
    prefill = [s for s in spans if s.query_len > 1]
    # One host→device copy for every index tensor of the step.
    host: list[list[int]] = []
    if decode:
        width = max(len(s.block_ids) for s in decode)
        host += [[s.query_start for s in decode], [s.num_computed + 1 for s in decode]]
        host += [s.block_ids + [0] * (width - len(s.block_ids)) for s in decode]
    if prefill:
        width_p = max(len(s.block_ids) for s in prefill)
        host += [[s.query_start for s in prefill], [s.query_len for s in prefill]]
        host += [[s.num_computed + s.query_len for s in prefill]]
        host += [s.block_ids + [0] * (width_p - len(s.block_ids)) for s in prefill]
    flat = torch.tensor([v for row in host for v in row], dtype=torch.int32).to(device)
    cursor = 0

    def take(n: int, shape: tuple[int, ...]) -> torch.Tensor:
        nonlocal cursor
        view = flat[cursor : cursor + n].view(shape)
        cursor += n
        return view

    decode_batch = prefill_batch = None
    if decode:
        n = len(decode)
        rows, lens = take(n, (n,)), take(n, (n,))
        decode_batch = DecodeBatch(
            rows, take(n * width, (n, width)), lens, max(s.num_computed + 1 for s in decode)
        )
    if prefill:
        n = len(prefill)
        starts, qlens, lens = take(n, (n,)), take(n, (n,)), take(n, (n,))
        prefill_batch = PrefillBatch(
            starts, qlens, take(n * width_p, (n, width_p)), lens, max(s.query_len for s in prefill)
        )
    return KernelMetadata(block_size, decode_batch, prefill_batch, window)
