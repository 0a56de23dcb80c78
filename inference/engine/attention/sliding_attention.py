"""Sliding-window attention over the paged cache (torch path, any device).

A query at position p sees keys at positions (p-W, p] only. The keys inside the window are
gathered (at most W + q_len of them, so the cost is bounded however long the sequence) and one
SDPA runs with an explicit boolean mask. Positions come from the span: its listed context
covers [cached_start, num_cached) in block order, each in-place run starting at its
view_position; the gathered slots fill the rest in order. So a span whose cached context starts
mid-sequence (a sliding layer that keeps only the window's blocks) masks correctly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def windowed_attention(
    q, k, v, k_cache, v_cache, meta, scale: float, window: int, out=None, skip=frozenset()
) -> torch.Tensor:
    """Each query at position p over the keys at positions (p-W, p]: the window's keys are
    gathered (at most W + q_len of them) and masked explicitly. Spans in `skip` are left as
    they are in `out` (the decode windows computed them)."""
    if window < 1:
        raise ValueError(f"window must be ≥ 1, got {window}")
    out = torch.empty_like(q) if out is None else out
    shared_index = set(meta.shared.span_indices) if meta.shared is not None else set()
    for index, span in enumerate(meta.spans):
        if index in skip:
            continue
        rows = slice(span.query_start, span.query_start + span.query_len)
        if span.query_len == 1:  # decode: its own key is already in the listed context
            q_pos = torch.tensor([span.num_cached - 1], device=q.device)
        else:
            q_pos = torch.arange(span.num_cached, span.num_cached + span.query_len, device=q.device)
        lowest = int(q_pos[0]) - window + 1  # the first query's oldest visible key
        pieces = []
        if index in shared_index:
            shared = meta.shared
            start = span.cached_start - shared.num_slots
            positions = [start + offset for offset in shared.view_offsets or []]
            pieces += _listed_keys(
                start, shared.num_slots, shared.view_runs, positions, shared.gathered_slots,
                lowest, k_cache, v_cache,
            )  # fmt: skip
        pieces += _listed_keys(
            span.cached_start, span.num_cached - span.cached_start, span.view_runs,
            span.view_positions or [], span.gathered_slots, lowest, k_cache, v_cache,
        )  # fmt: skip
        if span.query_len > 1:  # the new tokens, which come after the listed context
            pieces.append((k[rows], v[rows], q_pos))
        keys = torch.cat([p[0] for p in pieces]).to(q.dtype)  # (n, KVH, D)
        values = torch.cat([p[1] for p in pieces]).to(q.dtype)
        k_pos = torch.cat([p[2] for p in pieces])  # (n,)
        visible = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] > q_pos[:, None] - window)
        o = F.scaled_dot_product_attention(
            q[rows].transpose(0, 1).unsqueeze(0),  # (1, H, q_len, D)
            keys.transpose(0, 1).unsqueeze(0),  # (1, KVH, n, D)
            values.transpose(0, 1).unsqueeze(0),
            attn_mask=visible,
            scale=scale,
            enable_gqa=True,
        )
        out[rows] = o[0].transpose(0, 1)  # (q_len, H, D)
    return out


def _listed_keys(
    start, num_listed, view_runs, view_positions, gathered_slots, lowest, k_cache, v_cache
):
    """(keys, values, positions) of a listed context from position `lowest` on."""
    pieces = []
    in_runs = torch.zeros(num_listed, dtype=torch.bool)
    for (a, b), pos in zip(view_runs, view_positions, strict=True):
        in_runs[pos - start : pos - start + b - a] = True
        skip = max(0, lowest - pos)
        if skip < b - a:
            positions = torch.arange(pos + skip, pos + b - a, device=k_cache.device)
            pieces.append((k_cache[a + skip : b], v_cache[a + skip : b], positions))
    if gathered_slots is not None:
        positions = (start + (~in_runs).nonzero().squeeze(1)).to(k_cache.device)
        keep = positions >= lowest
        slots = gathered_slots[keep]
        pieces.append((k_cache[slots], v_cache[slots], positions[keep]))
    return pieces
