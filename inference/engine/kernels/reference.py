"""Torch references of the kernels, plain torch (importing this module does not import triton).

The attention kernels are tested against `paged_attention_reference`: for each sequence, gather
its context from the paged cache through its block table and run plain SDPA in fp32 with the
causal and sliding-window mask written out. Slow and obvious on purpose. `copy_slots_reference`
is copy_slots' torch ops, which the runner also uses off CUDA. `sparse_attention_reference` is
DeepSeek-V4's attention over the rows each query reads (kernels/v4_sparse_attention.py's
reference; V4's torch path computes the same a tile of queries at a time,
models/deepseek_v4/tiled_attention.py, tested equal to it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def paged_attention_reference(
    q: torch.Tensor,  # (T, n_heads, head_dim)
    k_cache: torch.Tensor,  # (num_slots, n_kv_heads, head_dim)
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (B, max_blocks)
    seq_lens: torch.Tensor,  # (B,) context length, this step's tokens included
    query_starts: torch.Tensor,  # (B,) first row of each sequence's queries in q
    query_lens: torch.Tensor,  # (B,) the queries are the sequence's last query_len positions
    block_size: int,
    scale: float,
    window: int | None = None,  # a query at p sees keys in (p - window, p]
    first_blocks: torch.Tensor | None = None,  # (B,) block index of each table's first entry
) -> torch.Tensor:
    out = torch.zeros_like(q)
    for b in range(block_tables.shape[0]):
        seq_len, q_start, q_len = int(seq_lens[b]), int(query_starts[b]), int(query_lens[b])
        if q_len == 0:
            continue
        first = 0 if first_blocks is None else int(first_blocks[b])
        # Only the positions the table lists (from its first block on) exist in the cache.
        pos = torch.arange(first * block_size, seq_len, device=q.device)
        table = block_tables[b].long()
        slots = table[pos // block_size - first] * block_size + pos % block_size
        k_ctx = k_cache[slots].float().transpose(0, 1).unsqueeze(0)  # (1, KVH, n, D)
        v_ctx = v_cache[slots].float().transpose(0, 1).unsqueeze(0)
        qs = q[q_start : q_start + q_len].float().transpose(0, 1).unsqueeze(0)  # (1, H, q_len, D)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        keep = pos[None, :] <= q_pos  # (q_len, n)
        if window is not None:
            keep &= pos[None, :] > q_pos - window
        o = F.scaled_dot_product_attention(
            qs, k_ctx, v_ctx, attn_mask=keep, scale=scale, enable_gqa=True
        )  # (1, H, q_len, D)
        out[q_start : q_start + q_len] = o[0].transpose(0, 1).to(q.dtype)
    return out


def copy_slots_reference(cache: torch.Tensor, src_slots, dst_slots) -> None:
    """The batched torch ops: gather the source rows of every cache, then scatter them."""
    cache.index_copy_(1, dst_slots.long(), cache.index_select(1, src_slots.long()))


def sparse_attention_reference(
    q: torch.Tensor,  # (Q, H, D)
    parts: list[tuple[torch.Tensor, torch.Tensor]],  # (pool (N, D), rows (Q, K) -1 padded)
    sinks: torch.Tensor,  # (H,): each head's sink logit, a key with no value
    scale: float,
) -> torch.Tensor:
    """(Q, H, D) in q's dtype: each query over the pool rows it reads, every part's together,
    K = V (a row is both the key and the value), -1 rows masked, the sinks in the softmax (a
    query that reads no row gets zeros). Gathers each query's rows: (Q, K, D) in fp32."""
    rows = torch.cat([r for _, r in parts], dim=1)  # (Q, K)
    gathered = torch.cat(
        [pool[r.clamp(min=0)].to(q.dtype).float() for pool, r in parts], dim=1
    )  # (Q, K, D)
    logits = torch.matmul(q.float(), gathered.transpose(1, 2)) * scale  # (Q, H, K)
    logits = logits.masked_fill((rows < 0)[:, None, :], float("-inf"))
    sink_logits = sinks.float()[None, :, None].expand(q.shape[0], -1, 1)  # (Q, H, 1)
    combined = torch.cat([logits, sink_logits], dim=-1)
    probs = (combined - combined.amax(dim=-1, keepdim=True)).softmax(dim=-1)[..., :-1]
    return torch.matmul(probs, gathered).to(q.dtype)
