"""DeepSeek-V4 attention one sequence at a time, on the same modules and state as the batched
attention (deepseek_v4.attention): the torch reference the batched path is tested against.
Each sequence's window keys, closing windows and entries come from its own block lists here,
not from the step tables."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from inference.engine.models.deepseek_v4.attention import Attention
from inference.engine.models.deepseek_v4.config import CSA, HCA, SLIDING
from inference.engine.models.deepseek_v4.layers import apply_rope, unweighted_rms_norm


def window_slots(seq, lo: int, hi: int, size: int) -> torch.Tensor:
    """Sliding slots of the sequence's positions [lo, hi)."""
    first = seq.first_block
    ids = [seq.window_block_ids[p // size - first] * size + p % size for p in range(lo, hi)]
    return torch.tensor(ids, dtype=torch.long)


def entry_rows(kind: str, seq, lo: int, hi: int, size: int, rate: int) -> torch.Tensor:
    """Pool rows of entries [lo, hi): CSA's in the block of token rate · w, HCA's in the block
    of its last token."""
    if kind == CSA:
        per = size // rate
        ids = [seq.block_ids[w // per] * per + w % per for w in range(lo, hi)]
    else:
        ids = [seq.block_ids[(rate * w + rate - 1) // size] for w in range(lo, hi)]
    return torch.tensor(ids, dtype=torch.long)


def pool(compressor, raw, first: int, count: int, rotary) -> torch.Tensor:
    """Entries [first, first + count) from the raw tokens of windows [first - 1 or first,
    first + count): (count, head_dim)."""
    rate, hd = compressor.rate, compressor.head_dim
    kv, gate = raw.float().chunk(2, dim=-1)
    num_windows = kv.shape[0] // rate
    kv = kv.view(num_windows, rate, -1)  # (windows, rate, width)
    gate = gate.view(num_windows, rate, -1) + compressor.position_bias
    if compressor.overlap:
        has_prev = num_windows - count
        pad_kv = kv.new_zeros(1, rate, hd)
        pad_gate = gate.new_full((1, rate, hd), float("-inf"))
        prev_kv = torch.cat([pad_kv, kv[..., :hd]])[has_prev : has_prev + count]
        prev_gate = torch.cat([pad_gate, gate[..., :hd]])[has_prev : has_prev + count]
        kv = torch.cat([prev_kv, kv[has_prev:, :, hd:]], dim=1)  # (count, 2·rate, hd)
        gate = torch.cat([prev_gate, gate[has_prev:, :, hd:]], dim=1)
    pooled = compressor.kv_norm((kv * gate.softmax(dim=1)).sum(dim=1))
    return apply_rope(pooled[:, None, :], rotary(torch.arange(first, first + count) * rate))[:, 0]


def select(indexer, x, q_residual, rope, keys, positions, rate: int) -> torch.Tensor:
    """(Q, E) additive mask: 0 where the query keeps the entry, -inf elsewhere."""
    num_entries = keys.shape[0]
    q = indexer.q_b_proj(q_residual).view(-1, indexer.num_heads, indexer.head_dim)
    q = apply_rope(q, rope)
    scores = F.relu(torch.einsum("qhd,ed->qhe", q.float(), keys.float())) * indexer.head_dim**-0.5
    weights = indexer.scorer.weights_proj(x).float() * indexer.num_heads**-0.5
    scores = (scores * weights[..., None]).sum(dim=1)  # (Q, E)
    closed = (positions + 1) // rate
    future = torch.arange(num_entries)[None, :] >= closed[:, None]
    k = min(indexer.topk, num_entries)
    picks = scores.masked_fill(future, float("-inf")).topk(k, dim=-1).indices
    picks = torch.where(picks < closed[:, None], picks, num_entries)
    mask = scores.new_full((q.shape[0], num_entries + 1), float("-inf"))
    return mask.scatter_(-1, picks, 0.0)[:, :num_entries]


def reference_forward(self: Attention, x, positions, ropes, state, meta, rows=None) -> torch.Tensor:
    """Attention.forward with every sequence compressed and attended on its own; with `rows`,
    every query's output computed, then theirs taken."""
    size = meta.tables.block_size
    num_tokens = x.shape[0]
    rope = ropes.main if self.kind == SLIDING else ropes.compress
    q_residual = self.q_a_norm(self.q_a_proj(x))
    q = self.q_b_proj(q_residual).view(num_tokens, self.num_heads, self.head_dim)
    q = apply_rope(unweighted_rms_norm(q, self.eps), rope)
    kv = apply_rope(self.kv_norm(self.kv_proj(x))[:, None, :], rope)[:, 0]
    state.window[meta.window_slots] = kv.to(state.window.dtype)
    if self.compressor is not None:
        _compress(self, x, state, meta, ropes.compress_rotary, size)
    out = torch.empty_like(q)
    for seq in meta.sequences:
        own = slice(seq.query_start, seq.query_start + seq.query_len)
        out[own] = _attend(
            self, seq, q[own], x[own], q_residual[own], positions[own], ropes, state, size
        )
    out = apply_rope(out, rope.inverse())
    grouped = out.reshape(num_tokens, self.o_a_proj.n_groups, -1)
    outputs = self.o_b_proj(self.o_a_proj(grouped))
    return outputs if rows is None else outputs[rows]


def _compress(self, x, state, meta, rotary, size: int) -> None:
    compressor, indexer = self.compressor, getattr(self.compressor, "indexer", None)
    projections = compressor.project(x)
    if indexer is not None:
        projections = torch.cat([projections, indexer.project(x)], dim=-1)
    state.projections[meta.window_slots] = projections.to(state.projections.dtype)
    split = compressor.projection_width
    for seq in meta.sequences:
        first, last = seq.start // self.rate, seq.end // self.rate
        if first == last:
            continue
        has_prev = compressor.overlap and first > 0
        has_prev = has_prev and self.rate * (first - 1) >= seq.window_start
        lo = self.rate * (first - 1 if has_prev else first)
        raw = state.projections[window_slots(seq, lo, self.rate * last, size)]
        entries = pool(compressor, raw[:, :split], first, last - first, rotary)
        ids = entry_rows(self.kind, seq, first, last, size, self.rate)
        state.entries[ids] = entries.to(state.entries.dtype)
        if indexer is not None:
            keys = pool(indexer, raw[:, split:], first, last - first, rotary)
            state.index_entries[ids] = keys.to(state.index_entries.dtype)


def _attend(self, seq, q, x, q_residual, positions, ropes, state, size: int):
    lo = max(seq.window_start, seq.start - self.window + 1)
    keys = state.window[window_slots(seq, lo, seq.end, size)].to(q.dtype)
    key_pos = torch.arange(lo, seq.end)
    visible = (key_pos[None, :] <= positions[:, None]) & (
        key_pos[None, :] > positions[:, None] - self.window
    )
    bias = torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))
    if self.rate and seq.end >= self.rate:
        num_entries = seq.end // self.rate
        ids = entry_rows(self.kind, seq, 0, num_entries, size, self.rate)
        closed = (positions + 1) // self.rate
        if self.kind == HCA:
            future = torch.arange(num_entries)[None, :] >= closed[:, None]
            entry_bias = torch.zeros(future.shape).masked_fill(future, float("-inf"))
        else:
            rows = slice(seq.query_start, seq.query_start + seq.query_len)
            entry_bias = select(
                self.compressor.indexer,
                x,
                q_residual,
                ropes.compress.at(rows),
                state.index_entries[ids],
                positions,
                self.rate,
            )
        keys = torch.cat([keys, state.entries[ids].to(q.dtype)])
        bias = torch.cat([bias, entry_bias], dim=1)
    logits = torch.einsum("qhd,kd->qhk", q.float(), keys.float()) * self.scale + bias[:, None, :]
    sinks = self.sinks.float()[None, :, None].expand(q.shape[0], -1, 1)
    combined = torch.cat([logits, sinks], dim=-1)
    probs = (combined - combined.amax(dim=-1, keepdim=True)).softmax(dim=-1)[..., :-1]
    return torch.einsum("qhk,kd->qhd", probs, keys.float()).to(q.dtype)
