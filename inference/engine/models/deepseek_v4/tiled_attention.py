"""DeepSeek-V4's attention and indexer scores on the torch path, a tile of queries at a time
(deepseek_v4.query_tiles says what a tile reads and why). The math is that of the kernels'
references, kernels/reference.sparse_attention_reference and
kernels/v4_reference.indexer_scores_reference, which gather each query's rows; here each tile's
shared keys are gathered once and read by all its queries as one matrix product, and only the
rows a query picks for itself (CSA's top-k) are gathered per query.
tests/inference/engine/test_deepseek_v4_tiles.py holds the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def gather_rows(pool: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(*rows.shape, *pool.shape[1:]): pool[rows], -1 rows reading row 0 (masked by the
    caller). index_select on the flattened rows: several times faster on CPU than indexing
    with a 2-d or 3-d tensor of rows."""
    picked = pool.index_select(0, rows.clamp(min=0).flatten())
    return picked.view(*rows.shape, *pool.shape[1:])


def mask_bias(mask: torch.Tensor) -> torch.Tensor:
    """mask's shape in fp32: 0 where it is True, -inf where not; added to logits it masks them
    (on the CPU ~5x faster than masked_fill with a mask broadcast over the heads: `python -m
    benchmarks v4-ops`), so a step builds it once for every layer."""
    return torch.zeros(mask.shape, device=mask.device).masked_fill_(~mask, float("-inf"))


@dataclass(frozen=True, slots=True)
class SharedKeys:
    """Keys every query of a tile may read, each through its mask."""

    pool: torch.Tensor  # (pool rows, D)
    rows: torch.Tensor  # (tiles, K): pool rows, -1 padded
    mask: torch.Tensor  # (tiles, size, K) bool: query b reads key j
    bias: torch.Tensor  # (tiles, size, K) fp32: mask_bias(mask)


@dataclass(frozen=True, slots=True)
class OwnKeys:
    """Keys each query reads for itself."""

    pool: torch.Tensor  # (pool rows, D)
    rows: torch.Tensor  # (tiles, size, K): pool rows, -1 padded (and masked)


def tiled_attention(
    q: torch.Tensor,  # (tiles, size, H, D): each tile's queries (padded ones are never read)
    parts: list[SharedKeys | OwnKeys],
    sinks: torch.Tensor,  # (H,): each head's sink logit, a key with no value
    scale: float,
) -> torch.Tensor:
    """(tiles, size, H, D) in q's dtype: each query over the keys it reads, every part's
    together, K = V, the sinks in the softmax (a query that reads no key gets zeros)."""
    tiles, size, heads, _ = q.shape
    qf = q.float() * scale  # scaled here, on fewer floats than the logits
    keys, logits = [], []
    for part in parts:
        # The pool's dtype as q's, then fp32: what the reference computes in.
        gathered = gather_rows(part.pool, part.rows).to(q.dtype).float()
        if isinstance(part, SharedKeys):  # (tiles, K, D): one product per tile
            scores = torch.matmul(qf.flatten(1, 2), gathered.transpose(1, 2))  # (tiles, size·H, K)
            scores = scores.view(tiles, size, heads, -1).add_(part.bias[:, :, None, :])
        else:  # (tiles, size, K, D): one product per query
            scores = torch.matmul(qf, gathered.transpose(-1, -2))  # (tiles, size, H, K)
            scores.masked_fill_((part.rows < 0)[:, :, None, :], float("-inf"))
        keys.append(gathered)
        logits.append(scores)
    logits.append(sinks.float()[:, None].expand(tiles, size, heads, 1))
    combined = torch.cat(logits, dim=-1)  # (tiles, size, H, all keys + 1)
    probs = combined.softmax(dim=-1)
    out = torch.zeros_like(q, dtype=torch.float32)
    start = 0
    for part, gathered in zip(parts, keys, strict=True):
        width = gathered.shape[-2]
        p = probs[..., start : start + width]
        start += width
        if isinstance(part, SharedKeys):
            out += torch.matmul(p.reshape(tiles, size * heads, width), gathered).view_as(out)
        else:
            out += torch.matmul(p, gathered)  # (tiles, size, H, D)
    return out.to(q.dtype)


# Most scores (query, head, entry) the indexer holds at once, 1 MB in fp32: a prefill tile's
# (32 · 16 · E) stay in cache between the product, the ReLU and the heads' sum (20% faster
# than the whole chunk's at once, which went to memory and back twice).
SCORES_PER_PASS = 1 << 18


def tiled_indexer_scores(
    q: torch.Tensor,  # (tiles, size, H, D): the indexer's roped queries
    weights: torch.Tensor,  # (tiles, size, H): each head's weight per query
    keys: SharedKeys,  # the tile's indexer keys (the entries its last query sees)
    scale: float,
) -> torch.Tensor:
    """(tiles, size, E) fp32: ∑_h weights · scale · ReLU(q_h · key) for each query and each
    entry of its tile; -inf where the query does not see the entry."""
    tiles, size, heads, _ = q.shape
    gathered = gather_rows(keys.pool, keys.rows).float()  # (tiles, E, D)
    num_entries = gathered.shape[1]
    queries = q.float().flatten(1, 2)  # (tiles, size·H, D)
    weighted = weights.float()[:, :, None, :] * scale  # (tiles, size, 1, H)
    out = torch.empty(tiles, size, num_entries, device=q.device)
    step = max(1, SCORES_PER_PASS // max(1, size * heads * num_entries))
    for lo in range(0, tiles, step):
        part = slice(lo, lo + step)
        scores = torch.matmul(queries[part], gathered[part].transpose(1, 2))  # (t, size·H, E)
        scores = F.relu_(scores).view(scores.shape[0], size, heads, num_entries)
        torch.matmul(weighted[part], scores, out=out[part].unsqueeze(2))  # the heads summed
    return out.add_(keys.bias)
