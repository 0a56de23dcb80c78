"""Decode attention for all one-token sequences of a step at once (torch path, full layers).

A decode step's sequences read their contexts from the paged cache: a shared head, each one's
own prompt tail, and the blocks its decoding filled, one at a time. Read span by span that is
~10 small attention calls per layer, each one an OpenMP parallel region, plus the log-sum-exp
merges of their parts, and on a 2-core CPU those calls, not the bytes, set the step's time.

Here the slot runs of every decoding sequence are laid on the slot axis and grouped into
windows: runs closer than `MAX_GAP` slots share one. A window is read in place, once, by one
attention call for all the sequences that have keys in it, with an additive mask that lets
each query see only its own sequence's slots (a key shared by several sequences is read once
for all of them, as the cascade of a shared prefix did). In a typical step (a head cached
early, tails and decode blocks allocated since) one window covers everything: one call per
layer, no merge. Runs left alone in a short window are gathered into one window of their own.
Attention over a set of keys does not depend on their order, so reading a window in slot
order gives the result of reading each context in position order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.engine.attention.block_runs import block_runs

# A gap of unused slots is read (and masked) rather than split into another call when it is
# at most this long (reading ~512 slots costs about what one more attention call does) and
# the window's unused slots stay fewer than its used ones.
MAX_GAP = 512
# Windows shorter than this (isolated blocks) are gathered together into one.
MIN_WINDOW = 64
# A long window is read as this many equal slices, each a batch entry of the attention call:
# the CPU kernel shares its work among threads by (batch, KV head), and a model with 3 KV
# heads would otherwise keep one of 2 threads idle a third of the time.
SPLITS = 4
MIN_SPLIT_LEN = 1024


@dataclass(slots=True)
class DecodeWindow:
    members: torch.Tensor  # (R,) positions in DecodeBatch.rows of the sequences with keys here
    mask: torch.Tensor  # (R, L) bool: the sequence owns the window's key
    start: int = 0  # the slots [start, start + L) read in place ...
    slots: torch.Tensor | None = None  # ... or these slots, gathered
    read: _Read | None = None  # how the first layer read it; the next layers read the same


@dataclass(slots=True)
class _Read:
    start: int
    length: int  # a multiple of splits; past the window's end (or before it) is masked
    splits: int
    additive: torch.Tensor  # (S, 1, R*G, L/S) 0 where the query's sequence owns the key
    no_keys: torch.Tensor  # (S, 1, R*G) whether a query has no key in the slice


@dataclass(slots=True)
class DecodeBatch:
    span_indices: list[int]  # the one-token spans of the step's metadata handled here
    rows: torch.Tensor  # (B,) each one's query row in the flattened batch
    windows: list[DecodeWindow]
    # The sliding window its runs were cut to (only positions (p-W, p] listed); None: full.
    window: int | None = None
    # Its rows are 0, 1, ... B-1: a step of decodes only reads and writes them in place.
    rows_in_order: bool = False


def slot_runs(
    block_ids: list[int], num_slots: int, block_size: int, first: int = 0, lowest: int = 0
) -> list[tuple[int, int]]:
    """The [start, end) slot ranges holding positions [lowest, num_slots) of a sequence whose
    `block_ids[0]` is its block number `first` (a sliding layer keeps only its window's)."""
    low = max(lowest // block_size, first)  # the first and last block index read
    high = -(-num_slots // block_size)
    ids = block_ids[low - first : high - first]
    runs = [(ids[i] * block_size, (ids[j - 1] + 1) * block_size) for i, j in block_runs(ids)]
    if runs:  # the first block may start at `lowest`, the last holds what is filled of it
        runs[0] = (runs[0][0] + max(0, lowest - low * block_size), runs[0][1])
        last_filled = num_slots - (high - 1) * block_size
        runs[-1] = (runs[-1][0], runs[-1][1] - block_size + min(block_size, last_filled))
    return runs


def plan_decode_batch(
    span_indices: list[int],
    rows: list[int],
    runs_per_sequence: list[list[tuple[int, int]]],
    device: torch.device,
    window: int | None = None,
) -> DecodeBatch | None:
    """Group the sequences' slot runs into windows; None when there is no sequence.
    `window`: the sliding window the runs were cut to, if they were."""
    if not span_indices:
        return None
    tagged = sorted((a, b, seq) for seq, runs in enumerate(runs_per_sequence) for a, b in runs)
    groups: list[list[tuple[int, int, int]]] = []
    end = -1
    holes = used = 0  # slots of the current window read for nobody / for someone
    for a, b, seq in tagged:
        gap = max(0, a - end)
        # A window never reads more unused slots than used ones (at most twice the keys).
        if groups and gap <= MAX_GAP and holes + gap <= used + max(0, b - max(a, end)):
            groups[-1].append((a, b, seq))
            holes += gap
            used += max(0, b - max(a, end))
            end = max(end, b)
        else:
            groups.append([(a, b, seq)])
            end, holes, used = b, 0, b - a
    windows, loose = [], []
    for group in groups:
        start, stop = group[0][0], max(b for _, b, _ in group)
        if stop - start < MIN_WINDOW and len(groups) > 1:
            loose += group
        else:
            windows.append(_window(group, start, stop - start, device))
    if loose:
        windows.append(_gathered_window(loose, device))
    in_order = rows == list(range(len(rows)))
    return DecodeBatch(span_indices, torch.tensor(rows, device=device), windows, window, in_order)


def _window(group, start: int, length: int, device: torch.device) -> DecodeWindow:
    members = sorted({seq for _, _, seq in group})
    position = {seq: i for i, seq in enumerate(members)}
    mask = torch.zeros(len(members), length, dtype=torch.bool)
    for a, b, seq in group:
        mask[position[seq], a - start : b - start] = True
    return DecodeWindow(torch.tensor(members, device=device), mask.to(device), start=start)


def _gathered_window(group, device: torch.device) -> DecodeWindow:
    members = sorted({seq for _, _, seq in group})
    position = {seq: i for i, seq in enumerate(members)}
    slots: list[int] = []
    mask_rows: list[tuple[int, int, int]] = []
    for a, b, seq in group:
        mask_rows.append((position[seq], len(slots), len(slots) + b - a))
        slots.extend(range(a, b))
    mask = torch.zeros(len(members), len(slots), dtype=torch.bool)
    for row, a, b in mask_rows:
        mask[row, a:b] = True
    return DecodeWindow(
        torch.tensor(members, device=device),
        mask.to(device),
        slots=torch.tensor(slots, dtype=torch.long, device=device),
    )


def decode_attention(
    q: torch.Tensor,  # (T, H, D): the step's queries
    k_cache: torch.Tensor,  # (num_slots, KVH, D)
    v_cache: torch.Tensor,
    batch: DecodeBatch,
    scale: float,
    flash,
) -> torch.Tensor:
    """(B, H, D): each sequence's query over its whole context (its new key already written).

    `flash(q, k, v, mask, scale)` is attention with an additive mask returning (out, lse)."""
    n_heads, head_dim = q.shape[1], q.shape[2]
    n_kv = k_cache.shape[1]
    group = n_heads // n_kv
    num_seqs = batch.rows.shape[0]
    # (B, H, D) → (KVH, B, G, D): the queries of one KV group share its keys.
    own = q[:num_seqs] if batch.rows_in_order else q.index_select(0, batch.rows)
    folded = own.reshape(num_seqs, n_kv, group, head_dim).transpose(0, 1)
    parts = []
    # One window holding every sequence (the usual step) needs no lse: nothing to merge it with.
    whole = len(batch.windows) == 1 and batch.windows[0].members.shape[0] == num_seqs
    for window in batch.windows:
        if window.read is None:
            window.read = _plan_read(window, k_cache.shape[0], group, q.dtype)
        read = window.read
        if window.slots is None:
            ks = k_cache[read.start : read.start + read.length]
            vs = v_cache[read.start : read.start + read.length]
        else:
            ks = k_cache.index_select(0, window.slots)
            vs = v_cache.index_select(0, window.slots)
        members = window.members.shape[0]
        qs = folded if members == num_seqs else folded.index_select(1, window.members)
        qs = qs.reshape(1, n_kv, members * group, head_dim)
        o, lse = flash(
            qs.expand(read.splits, -1, -1, -1),
            _slices(ks, read.splits),
            _slices(vs, read.splits),
            read.additive,
            scale,
        )
        if whole:
            merged = _merge_slices(o, lse, read.no_keys) if read.splits > 1 else o
            merged = merged.view(n_kv, num_seqs, group, head_dim)
        else:
            if read.splits > 1:  # the kernel gives a slice without keys an lse of 0
                lse = lse.masked_fill(read.no_keys, float("-inf"))
            parts.append((window, o, lse))
    if not whole:  # every window's slices at once: one softmax over their lse
        merged = _merge_parts(parts, n_kv, num_seqs, group, head_dim, q)
    return merged.transpose(0, 1).reshape(num_seqs, n_heads, head_dim)


def _plan_read(window: DecodeWindow, num_slots: int, group: int, dtype) -> _Read:
    """The slot range to read (split in equal slices when long) and its additive mask."""
    mask = window.mask.repeat_interleave(group, dim=0)  # one row per query: (R*G, L)
    length = mask.shape[1]
    splits = SPLITS if window.slots is None and length >= MIN_SPLIT_LEN else 1
    padded = -(-length // splits) * splits
    start = window.start
    if padded > length:
        # Read a little past the window (or before it, at the cache's end), masked out.
        lead = max(0, start + padded - num_slots)
        start -= lead
        mask = torch.nn.functional.pad(mask, (lead, padded - length - lead), value=False)
    mask = mask.view(mask.shape[0], splits, padded // splits).transpose(0, 1)  # (S, R*G, L/S)
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    additive.masked_fill_(~mask, float("-inf"))
    return _Read(start, padded, splits, additive.unsqueeze(1), ~mask.any(-1).unsqueeze(1))


def _slices(cache_rows: torch.Tensor, splits: int) -> torch.Tensor:
    """(L, KVH, D) → (S, KVH, L/S, D), a view."""
    length, n_kv, head_dim = cache_rows.shape
    return cache_rows.view(splits, length // splits, n_kv, head_dim).transpose(1, 2)


def _merge_slices(o: torch.Tensor, lse: torch.Tensor, no_keys: torch.Tensor) -> torch.Tensor:
    """(S, KVH, R*G, D), (S, KVH, R*G) → the whole window's (KVH, R*G, D), merged in float32.
    The kernel gives a query with no key in a slice an lse of 0, not -inf: masked here."""
    lse = lse.masked_fill(no_keys, float("-inf"))
    weights = torch.softmax(lse.float(), dim=0).unsqueeze(-1)
    return (o.float() * weights).sum(0)


def _merge_parts(parts, n_kv: int, num_seqs: int, group: int, head_dim: int, like):
    """Combine every window's slices, (S, KVH, M*G, D) outputs and (S, KVH, M*G) lse each, by
    log-sum-exp: (KVH, B, G, D). A sequence absent from a window gets weight 0 there."""
    total = sum(o.shape[0] for _, o, _ in parts)
    shape = (total, n_kv, num_seqs, group)
    outs = like.new_zeros((*shape, head_dim), dtype=torch.float32)
    lses = like.new_full(shape, float("-inf"), dtype=torch.float32)
    at = 0
    for window, o, lse in parts:
        splits, members = o.shape[0], window.members.shape[0]
        o = o.view(splits, n_kv, members, group, head_dim)
        lse = lse.view(splits, n_kv, members, group)
        if members == num_seqs:
            outs[at : at + splits] = o
            lses[at : at + splits] = lse
        else:
            outs[at : at + splits].index_copy_(2, window.members, o.float())
            lses[at : at + splits].index_copy_(2, window.members, lse.float())
        at += splits
    weights = torch.softmax(lses, dim=0).unsqueeze(-1)
    return (outs * weights).sum(0)  # (KVH, B, G, D)
