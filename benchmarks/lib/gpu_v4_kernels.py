"""The GPU benchmark's V4 indexer and compressor kernels at V4 Flash's sizes (index heads 64 of
128, entries of 512, CSA rate 4, HCA rate 128), each checked against its torch reference
(kernels/v4_reference.py) and timed as gpu_kernels' cases are. Bytes moved count what the
kernel must read and write once: for the indexer, each query's visible entries' keys (distinct
per sequence), its row of pool rows and its scores."""

from __future__ import annotations

import torch

from benchmarks.lib.gpu_kernels import TOLERANCE, KernelTiming, _checked, _median_ms, _randn
from inference.engine.kernels.v4_compress import compress_pool
from inference.engine.kernels.v4_indexer import indexer_scores
from inference.engine.kernels.v4_reference import compress_pool_reference, indexer_scores_reference

INDEX_HEADS, INDEX_DIM, HEAD_DIM, ROPE_DIM, CSA_RATE, HCA_RATE = 64, 128, 512, 64, 4, 128


def indexer_case(num_seqs, queries_each, context, device, gen) -> KernelTiming:
    """num_seqs sequences of `context` tokens, each with its last `queries_each` tokens as
    queries; a query sees the entries its position closed (a prefix of its sequence's row)."""
    num_entries = context // CSA_RATE
    rows = torch.randperm(num_seqs * num_entries, generator=gen).view(num_seqs, num_entries)
    positions = torch.arange(context - queries_each, context)  # (queries_each,)
    seen = (positions + 1) // CSA_RATE  # entries each query sees
    visible = rows.repeat_interleave(queries_each, dim=0)  # (Q, E)
    visible[torch.arange(num_entries) >= seen.repeat(num_seqs)[:, None]] = -1
    visible = visible.to(device)
    keys = _randn((num_seqs * num_entries, INDEX_DIM), device)
    q = _randn((visible.shape[0], INDEX_HEADS, INDEX_DIM), device)
    weights = torch.randn(visible.shape[0], INDEX_HEADS, device=device) * INDEX_HEADS**-0.5
    args = (q, weights, keys, visible, INDEX_DIM**-0.5)
    got, want = indexer_scores(*args), indexer_scores_reference(*args)
    live = visible >= 0
    ok = torch.equal(torch.isneginf(got), ~live) and torch.allclose(got[live], want[live],
                                                                    **TOLERANCE)  # fmt: skip
    error = (got[live] - want[live]).abs().max().item()
    moved = keys.numel() * 2 + visible.numel() * 8 + got.numel() * 4 + q.numel() * 2
    flops = 2.0 * int(live.sum()) * INDEX_HEADS * INDEX_DIM
    shape = (f"{num_seqs} seq × {queries_each} q at {context} ctx ({num_entries} entries), "
             f"H{INDEX_HEADS}/D{INDEX_DIM}")  # fmt: skip
    ms = _median_ms(lambda: indexer_scores(*args))
    return KernelTiming("v4 indexer scores", shape, ms, moved, flops, error, ok)


def compress_case(name, num_windows, rate, head_dim, overlap, device, gen) -> KernelTiming:
    """num_windows windows closing at once, their tokens' projections scattered over a pool
    with CSA's row layout (main kv and gate, then the indexer's)."""
    width = 2 * head_dim if overlap else head_dim
    columns = 4 * HEAD_DIM + 4 * INDEX_DIM if overlap else 2 * HEAD_DIM
    num_slots = 2 * num_windows * rate + 64
    projections = _randn((num_slots, columns), device)
    order = torch.randperm(num_slots, generator=gen)[: 2 * num_windows * rate].to(device)
    slots = order[: num_windows * rate].view(num_windows, rate)
    prev_slots = order[num_windows * rate :].view(num_windows, rate).clone()
    prev_slots[0] = -1  # the first window of a sequence pools alone
    angles = torch.rand(num_windows, ROPE_DIM // 2, device=device) * 6.28
    column = 4 * HEAD_DIM if overlap and head_dim == INDEX_DIM else 0
    args = (
        projections, column, slots, prev_slots if overlap else None,
        (0.5 * _randn((rate, width), device)), 1 + 0.1 * _randn((head_dim,), device), 1e-6,
        angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1),
    )  # fmt: skip
    positions = 2 * rate if overlap else rate
    moved = num_windows * positions * 2 * head_dim * 2 + num_windows * head_dim * 4
    shape = f"{num_windows} windows × {positions} positions × D{head_dim}"
    return _checked(name, shape, lambda: compress_pool(*args),
                    lambda: compress_pool_reference(*args), _median_ms, moved)  # fmt: skip


def v4_indexer_compress_cases(device, gen, quick: bool) -> list[KernelTiming]:
    """Decode at 4 and 64 in flight (64k context), a prefill chunk, and the pooling of a
    prefill chunk's windows (2048 tokens: 512 CSA windows; 16 sequences' HCA windows)."""
    chunk = 256 if quick else 1024
    return [
        indexer_case(4, 1, 65536, device, gen),
        indexer_case(64, 1, 16384 if quick else 65536, device, gen),
        indexer_case(1, chunk, 16384, device, gen),
        compress_case("v4 compress (CSA)", 512, CSA_RATE, HEAD_DIM, True, device, gen),
        compress_case("v4 compress (CSA indexer)", 512, CSA_RATE, INDEX_DIM, True, device, gen),
        compress_case("v4 compress (HCA)", 16, HCA_RATE, HEAD_DIM, False, device, gen),
    ]
