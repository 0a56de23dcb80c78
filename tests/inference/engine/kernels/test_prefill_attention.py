"""prefill_attention (new tokens over a cached prefix, causal) against the SDPA reference."""

import random

import pytest
import torch

from inference.engine.kernels.prefill_attention import (
    prefill_attention,
    prefill_attention_reference,
)

# (n_heads, n_kv_heads, head_dim, block_size, window, max_seq_len)
CASES = [
    (4, 4, 16, 1, None, 50),  # MHA, one-slot blocks
    (6, 2, 16, 4, None, 100),  # GQA 3: query tiles of 21 tokens × 3 heads
    (8, 2, 32, 16, 5, 120),  # GQA 4, window: early key tiles fully hidden for late rows
    (9, 3, 64, 16, 33, 150),  # SmolLM2's heads, window across block boundaries
    (8, 1, 24, 32, 1, 80),  # GQA 8, head_dim not a power of two, each query sees itself only
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "h{}-kv{}-d{}-bs{}-w{}-n{}".format(*c))
def test_prefill_attention_matches_reference(case, dtype, seed, make_batch, tolerance):
    heads, kv_heads, head_dim, block_size, window, max_len = case
    rng = random.Random(seed)
    batch = make_batch(
        rng, num_seqs=rng.randint(2, 4), num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, block_size=block_size, max_seq_len=max_len, dtype=dtype,
        decode=False,
    )  # fmt: skip
    out = torch.full_like(batch.q, float("nan"))
    args = (
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
        batch.query_starts, batch.query_lens, block_size, batch.scale,
    )  # fmt: skip
    max_query_len = int(batch.query_lens.max()) + rng.randint(0, 30)  # a loose bound is fine
    prefill_attention(*args, max_query_len=max_query_len, window=window, out=out)
    expected = prefill_attention_reference(*args, window=window)
    assert not out.isnan().any(), "some query rows were not written"
    torch.testing.assert_close(out, expected, **tolerance(dtype))


def test_prefill_leaves_rows_of_other_sequences_untouched(make_batch):
    batch = make_batch(
        random.Random(1), num_seqs=3, num_heads=4, num_kv_heads=2, head_dim=16, block_size=4,
        max_seq_len=40, dtype=torch.float32, decode=False,
    )  # fmt: skip
    # Only the middle sequence is a prefill in this call (the others: decode, another kernel).
    one = slice(1, 2)
    out = torch.full_like(batch.q, float("nan"))
    prefill_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables[one], batch.seq_lens[one],
        batch.query_starts[one], batch.query_lens[one], 4, batch.scale,
        max_query_len=int(batch.query_lens[1]), out=out,
    )  # fmt: skip
    start, length = int(batch.query_starts[1]), int(batch.query_lens[1])
    mine = torch.zeros(batch.q.shape[0], dtype=torch.bool)
    mine[start : start + length] = True
    assert not out[mine].isnan().any()
    assert out[~mine].isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_reads_a_window_table_that_starts_at_a_later_block(
    dtype, seed, window_batch, tolerance
):
    batch, window, tables, firsts = window_batch(
        seed, num_seqs=3, num_heads=6, dtype=dtype, decode=False
    )
    args = (
        batch.q, batch.k_cache, batch.v_cache, tables, batch.seq_lens, batch.query_starts,
        batch.query_lens, batch.block_size, batch.scale,
    )  # fmt: skip
    out = prefill_attention(
        *args, max_query_len=int(batch.query_lens.max()), window=window, first_blocks=firsts
    )
    expected = prefill_attention_reference(*args, window=window, first_blocks=firsts)
    assert not expected.isnan().any() and not out.isnan().any(), "a dropped block was read"
    torch.testing.assert_close(out, expected, **tolerance(dtype))
