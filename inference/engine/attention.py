"""Paged attention, torch reference path (CPU and any device).

The KV cache of a layer is two tensors (num_slots, n_kv_heads, head_dim); a slot is
block_id * block_size + offset. Per step the runner builds one AttentionMetadata: where the
new tokens' K/V go, and per sequence which slots form its context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class SequenceSpan:
    query_start: int  # first row of this sequence in the flattened batch
    query_len: int
    context_slots: torch.Tensor  # (context_len,) slots, oldest first, includes the new tokens
    mask: torch.Tensor | None  # (query_len, context_len) bool, None when not needed


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # (T,) where each new token's K/V is written
    spans: list[SequenceSpan]


def causal_mask(query_len: int, context_len: int, device: torch.device) -> torch.Tensor | None:
    """Query i (at absolute position context_len - query_len + i) sees keys ≤ its position."""
    if query_len == 1:
        return None
    offset = context_len - query_len
    rows = torch.arange(query_len, device=device)[:, None] + offset
    cols = torch.arange(context_len, device=device)[None, :]
    return cols <= rows  # (query_len, context_len)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Scatter the step's keys/values (T, n_kv_heads, head_dim) into their slots."""
    k_cache.index_copy_(0, slots, k)
    v_cache.index_copy_(0, slots, v)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """q: (T, n_heads, head_dim) → (T, n_heads, head_dim), each sequence over its own context."""
    out = torch.empty_like(q)
    for span in meta.spans:
        rows = slice(span.query_start, span.query_start + span.query_len)
        qs = q[rows].transpose(0, 1).unsqueeze(0)  # (1, n_heads, q_len, head_dim)
        ks = k_cache.index_select(0, span.context_slots).transpose(0, 1).unsqueeze(0)
        vs = v_cache.index_select(0, span.context_slots).transpose(0, 1).unsqueeze(0)
        # ks, vs: (1, n_kv_heads, context_len, head_dim)
        attn = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=span.mask, scale=scale, enable_gqa=True
        )  # (1, n_heads, q_len, head_dim)
        out[rows] = attn[0].transpose(0, 1)
    return out
