"""DeepSeek-V4's sparse attention kernel (kernels/v4_sparse_attention.py) against its torch
reference, on ragged steps whose row tables come from V4's own step tables (sequences mid-window,
past it, at CSA and HCA window edges; a padded query that reads no row), for sliding, CSA
(indexer-like picks) and HCA parts, fp32 and bf16, with and without split-K; its launcher's
checks. The tiny model with the kernel against the torch path: test_v4_model_kernels.py (logits
and written entries) and test_v4_engine_kernel_path.py (greedy tokens through the engine)."""

from __future__ import annotations

import random

import pytest
import torch

from inference.engine.kernels.v4_sparse_attention import (
    default_num_splits,
    sparse_attention,
    sparse_attention_reference,
)
from inference.engine.models.deepseek_v4.config import CSA, HCA, SLIDING
from inference.engine.models.deepseek_v4.state import SequenceState
from inference.engine.models.deepseek_v4.step_tables import StepTables

# Small shapes for the interpreter: window 16, blocks of 8, CSA rate 4, HCA rate 16.
BLOCK, WINDOW, CSA_RATE, HCA_RATE, TOPK = 8, 16, 4, 16, 3


def _row_tables(rng: random.Random, kind: str, num_seqs: int):
    """(window rows, entry rows or None, window pool size, entry pool size) for a ragged step:
    sequences with 1 to 9 new tokens after a history long past the window and the first HCA
    windows, none, one just short of an HCA (and CSA) window's close, and a random one; their
    blocks in a shuffled order; and one more query row that reads nothing (-1 padding)."""
    spans, query_start = [], 0
    histories = [rng.randrange(2 * HCA_RATE, 80), 0, HCA_RATE - rng.randint(1, 4)]
    for i in range(num_seqs):
        start = histories[i] if i < len(histories) else rng.randrange(0, 80)
        length = rng.randint(1, 9)
        spans.append((query_start, length, start))
        query_start += length
    num_blocks = sum(-(-(s + n) // BLOCK) for _, n, s in spans) + 2
    order = list(range(num_blocks))
    rng.shuffle(order)
    sequences = []
    for q0, n, start in spans:
        blocks = [order.pop() for _ in range(-(-(start + n) // BLOCK))]
        sequences.append(SequenceState(q0, n, start, blocks, blocks, 0))
    tables = StepTables.build(sequences, BLOCK, BLOCK // CSA_RATE, WINDOW, torch.device("cpu"))
    window = tables.window_keys()  # (T, W)
    entries, entry_pool = None, 0
    if kind == CSA:
        visible = tables.visible_entries(CSA, CSA_RATE)  # (T, E)
        entries = _picks(rng, visible, TOPK)
        entry_pool = num_blocks * BLOCK // CSA_RATE
    elif kind == HCA:
        entries = tables.visible_entries(HCA, HCA_RATE)
        entry_pool = num_blocks
    pad = torch.full((1, window.shape[1]), -1, dtype=window.dtype)
    window = torch.cat([window, pad])
    if entries is not None:
        entries = torch.cat([entries, torch.full((1, entries.shape[1]), -1, dtype=window.dtype)])
    return window, entries, num_blocks * BLOCK, entry_pool


def _picks(rng: random.Random, visible: torch.Tensor, topk: int) -> torch.Tensor:
    """The indexer's shape: each query keeps up to topk of its visible entries, in random
    order, -1 where it sees fewer."""
    width = min(topk, visible.shape[1])
    picked = torch.full((visible.shape[0], width), -1, dtype=visible.dtype)
    for i, row in enumerate(visible.tolist()):
        live = [r for r in row if r >= 0]
        rng.shuffle(live)
        picked[i, : min(width, len(live))] = torch.tensor(live[:width], dtype=visible.dtype)
    return picked


def _pool(num_rows: int, dim: int, rows: list[torch.Tensor], dtype, gen) -> torch.Tensor:
    """Random rows; those no table reads are NaN (a kernel reading one shows), but for row 0,
    which the reference's gather reads in place of -1."""
    pool = torch.randn(num_rows, dim, generator=gen)
    read = torch.zeros(num_rows, dtype=torch.bool)
    for r in rows:
        read[r[r >= 0]] = True
    read[0] = True
    pool[~read] = float("nan")
    return pool.to(dtype)


# Each part in both dtypes and with and without split-K, six cases rather than all twelve (the
# interpreter takes ~0.1 s a program; HCA with splits in bf16 alone took ~5 s).
@pytest.mark.parametrize(
    ("kind", "dtype", "num_splits"),
    [
        (SLIDING, torch.float32, 1),
        (SLIDING, torch.bfloat16, 3),
        (CSA, torch.bfloat16, 1),
        (CSA, torch.float32, 3),
        (HCA, torch.bfloat16, 1),
        (HCA, torch.float32, 3),
    ],
)
def test_sparse_attention_equals_its_reference_on_ragged_steps(
    kind, dtype, num_splits, seed, tolerance
):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_heads, head_dim = rng.choice([(4, 64), (20, 32)])  # 20: two head blocks, one partial
    window, entries, window_pool, entry_pool = _row_tables(rng, kind, num_seqs=4)
    num_queries = window.shape[0]
    q = torch.randn(num_queries, num_heads, head_dim, generator=gen).to(dtype)
    sinks = torch.randn(num_heads, generator=gen)
    parts = [(_pool(window_pool, head_dim, [window], dtype, gen), window)]
    if entries is not None:
        parts.append((_pool(entry_pool, head_dim, [entries], dtype, gen), entries))
    scale = head_dim**-0.5
    got = sparse_attention(q, parts, sinks, scale, num_splits=num_splits)
    want = sparse_attention_reference(q, parts, sinks, scale)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.float(), want.float(), **tolerance(dtype))
    assert torch.equal(got[-1], torch.zeros_like(got[-1]))  # the padded query: sinks alone
    if entries is not None:  # the entries mattered: without them the output differs
        alone = sparse_attention_reference(q, parts[:1], sinks, scale)
        reads_entries = (entries >= 0).any(dim=1)
        assert reads_entries.any()
        assert not torch.allclose(alone[reads_entries].float(), want[reads_entries].float())


def test_three_parts_int32_rows_and_no_rows_at_all(seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(5, 4, 16, generator=gen)
    sinks = torch.randn(4, generator=gen)
    pools = [torch.randn(n, 16, generator=gen) for n in (12, 7, 3)]
    rows = [
        torch.randint(-1, p.shape[0], (5, w), generator=gen)
        for p, w in zip(pools, (9, 4, 2), strict=True)
    ]
    parts = [(p, r.to(torch.int32)) for p, r in zip(pools, rows, strict=True)]
    for splits in (1, 2):
        torch.testing.assert_close(
            sparse_attention(q, parts, sinks, 0.25, num_splits=splits),
            sparse_attention_reference(q, parts, sinks, 0.25),
            atol=2e-5,
            rtol=2e-5,
        )
    empty = [(pools[0], rows[0][:, :0])]  # a step whose queries read no row: zeros
    assert torch.equal(sparse_attention(q, empty, sinks, 0.25), torch.zeros_like(q))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(pool_dtype=torch.bfloat16), "parts\\[0\\] pool must be one of"),
        (dict(pool_dim=32), "row width"),
        (dict(sinks_len=3), "one sink per head"),
        (dict(rows_len=2), "number of queries"),
        (dict(num_parts=4), "1 to 3"),
        (dict(num_splits=0), "num_splits"),
        (dict(rows_dtype=torch.float32), "rows must be one of"),
    ],
)
def test_sparse_attention_launcher_refuses_bad_inputs(change, message):
    q = torch.randn(3, 4, 16)
    pool = torch.randn(8, change.get("pool_dim", 16)).to(change.get("pool_dtype", torch.float32))
    rows = torch.zeros(change.get("rows_len", 3), 5).to(change.get("rows_dtype", torch.int64))
    parts = [(pool, rows)] * change.get("num_parts", 1)
    sinks = torch.zeros(change.get("sinks_len", 4))
    with pytest.raises(ValueError, match=message):
        sparse_attention(q, parts, sinks, 0.25, num_splits=change.get("num_splits"))


def test_split_k_only_where_the_programs_cannot_fill_the_gpu():
    # V4 Flash on an H100 (132 SMs): 64 heads are 4 programs a query; window 128 + 512 picks.
    assert default_num_splits(4 * 4, 512, 32, 132) == 16  # decode at 4 in flight
    assert default_num_splits(16 * 4, 512, 32, 132) == 5  # at 16: 320 programs
    assert default_num_splits(1024 * 4, 512, 32, 132) == 1  # a prefill chunk fills it alone
    assert default_num_splits(4 * 4, 40, 32, 132) == 2  # no split shorter than a tile
    assert default_num_splits(4, 512, 32, 0) == 1  # off CUDA (the interpreter)
