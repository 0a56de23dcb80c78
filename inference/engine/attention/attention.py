"""Paged attention, torch path (CPU and any device), over the metadata torch_metadata.py plans.

The KV cache of a layer is two tensors (num_slots, n_kv_heads, head_dim); a slot is
block_id * block_size + offset. A sequence attends over two parts, merged by log-sum-exp:
its cached context (slots written by earlier steps, read in place as views over runs of
consecutive slots; short scattered runs are gathered once) and its new tokens (this step's
K/V, causal). Reading the cache in place instead of gathering it into a copy is what keeps
a decode step close to the weight-read floor on a CPU.

Sliding-window layers pass `window=W`: a query at position p then sees keys in (p-W, p] only.
That path gathers the (bounded) keys inside the window and runs one SDPA with a boolean mask;
it needs the position of every listed slot, which is why a span records where its listed
context starts (a sliding layer's cache may hold only the window's blocks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from inference.engine.attention.decode_windows import decode_attention
from inference.engine.attention.sliding_attention import windowed_attention

if TYPE_CHECKING:
    from inference.engine.attention.torch_metadata import SequenceSpan, TorchAttentionMetadata


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Scatter the step's keys/values (T, n_kv_heads, head_dim) into their slots.

    On CUDA the store_kv kernel does it: it also skips padded slots (-1)."""
    if slots.is_cuda:
        from inference.engine.kernels.store_kv import store_kv

        store_kv(k, v, k_cache, v_cache, slots)
        return
    k_cache.index_copy_(0, slots, k.to(k_cache.dtype))  # a bfloat16 cache rounds them here
    v_cache.index_copy_(0, slots, v.to(v_cache.dtype))


def paged_attention(
    q: torch.Tensor,  # (T, n_heads, head_dim)
    k: torch.Tensor,  # (T, n_kv_heads, head_dim): this step's keys
    v: torch.Tensor,
    k_cache: torch.Tensor,  # (num_slots, n_kv_heads, head_dim)
    v_cache: torch.Tensor,
    meta: TorchAttentionMetadata,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    out = None
    batched: set[int] = set()
    decode = meta.decode
    if decode is not None and decode.window == window:
        decoded = decode_attention(
            q.to(k_cache.dtype), k_cache, v_cache, decode, scale, _flash_masked
        ).to(q.dtype)
        if decode.rows_in_order and decoded.shape[0] == q.shape[0]:
            return decoded  # a step of decodes only
        batched = set(decode.span_indices)
        out = torch.empty_like(q)
        out[decode.rows] = decoded
    out = torch.empty_like(q) if out is None else out
    if window is not None:
        return windowed_attention(q, k, v, k_cache, v_cache, meta, scale, window, out, batched)
    n_heads, head_dim = q.shape[1], q.shape[2]
    n_kv = k.shape[1]
    group = n_heads // n_kv

    def fold(span: SequenceSpan) -> torch.Tensor:
        # Queries of one KV group share keys: fold the group into the query axis.
        qs = q[span.query_start : span.query_start + span.query_len].transpose(0, 1)
        return qs.reshape(1, n_kv, group * span.query_len, head_dim)  # (1, KVH, G*q_len, D)

    shared_parts = {}
    if meta.shared is not None:
        shared = meta.shared
        stacked = torch.cat([fold(meta.spans[i]) for i in shared.span_indices], dim=2)
        o, lse = _merge(
            _cached_parts(stacked, shared.view_runs, shared.gathered_slots, k_cache, v_cache, scale)
        )
        for n, i in enumerate(shared.span_indices):  # one query row per KV group each
            rows = slice(n * group, (n + 1) * group)
            shared_parts[i] = (o[:, :, rows], lse[:, :, rows])

    for index, span in enumerate(meta.spans):
        if index in batched:
            continue
        # Without a window every key counts: the listed context must start at position 0.
        assert span.cached_start == (meta.shared.num_slots if index in shared_parts else 0)
        rows = slice(span.query_start, span.query_start + span.query_len)
        parts = []
        if span.query_len > 1:
            parts.append(_causal_part(q[rows].transpose(0, 1), k[rows], v[rows], group, scale))
        if index in shared_parts:
            parts.append(shared_parts[index])
        parts += _cached_parts(
            fold(span), span.view_runs, span.gathered_slots, k_cache, v_cache, scale
        )
        merged, _ = _merge(parts)  # (1, KVH, G*q_len, D)
        out[rows] = merged.view(n_heads, span.query_len, head_dim).transpose(0, 1)
    return out


def _cached_parts(folded, view_runs, gathered_slots, k_cache, v_cache, scale: float):
    parts = [_dense_part(folded, k_cache[a:b], v_cache[a:b], scale) for a, b in view_runs]
    if gathered_slots is not None:
        ks = k_cache.index_select(0, gathered_slots)
        vs = v_cache.index_select(0, gathered_slots)
        parts.append(_dense_part(folded, ks, vs, scale))
    return parts


def _flash(q, k, v, causal: bool, scale: float):
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, scale=scale
        )
    return _sdpa_with_lse(q, k, v, causal, scale)


def _flash_masked(q, k, v, mask, scale: float):
    """Attention with an additive mask (broadcast over heads): (output, logsumexp)."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask, scale=scale
        )
    scores = (q @ k.transpose(-1, -2)) * scale + mask
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


def _causal_part(qs, k_new, v_new, group: int, scale: float):
    """The new tokens over themselves: (H, q_len, D) × (q_len, KVH, D)."""
    n_heads, q_len, head_dim = qs.shape
    ks = k_new.transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0)  # (1, H, q_len, D)
    vs = v_new.transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0)
    o, lse = _flash(qs.unsqueeze(0), ks, vs, True, scale)  # (1, H, q_len, D), (1, H, q_len)
    n_kv = n_heads // group
    return o.reshape(1, n_kv, group * q_len, head_dim), lse.reshape(1, n_kv, group * q_len)


def _dense_part(folded, k_ctx, v_ctx, scale: float):
    """Folded queries (1, KVH, G*q, D) over cached keys (n, KVH, D), no mask; in the cache's
    dtype (a bfloat16 cache is read as it is, not copied up to float32)."""
    ks = k_ctx.transpose(0, 1).unsqueeze(0)  # (1, KVH, n, D), a view
    vs = v_ctx.transpose(0, 1).unsqueeze(0)
    o, lse = _flash(folded.to(ks.dtype), ks, vs, False, scale)
    return o.to(folded.dtype), lse


def _merge(parts):
    """Combine attention over disjoint key sets: weight each by exp(lse_i - logsumexp).

    Accumulated part by part (no stacked copy of the outputs: a prefill chunk's are MBs)."""
    if len(parts) == 1:
        return parts[0]
    total = torch.logsumexp(torch.stack([lse for _, lse in parts]), dim=0)  # (1, KVH, G*q)
    merged = None
    for o, lse in parts:
        weight = torch.exp(lse - total).unsqueeze(-1)
        merged = o * weight if merged is None else merged.addcmul_(o, weight)
    return merged, total


def _sdpa_with_lse(q, k, v, causal: bool, scale: float):
    """Portable version of the flash op: (output, logsumexp) over the last two axes."""
    scores = (q @ k.transpose(-1, -2)) * scale  # (1, heads, q_len, n)
    if causal:
        n_q, n_k = scores.shape[-2:]
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.softmax(scores, dim=-1) @ v, lse


def reference_attention(
    q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, scale: float
) -> torch.Tensor:
    """Plain SDPA over a gathered context (ctx, KVH, D) for queries at its last positions."""
    q_len, n_ctx = q.shape[0], k_ctx.shape[0]
    keep = torch.arange(n_ctx)[None, :] <= torch.arange(q_len)[:, None] + (n_ctx - q_len)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        k_ctx.transpose(0, 1).unsqueeze(0),
        v_ctx.transpose(0, 1).unsqueeze(0),
        attn_mask=keep,
        scale=scale,
        enable_gqa=True,
    )  # (1, H, q_len, D)
    return out[0].transpose(0, 1)
