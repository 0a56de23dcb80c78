"""decode_attention (split-K paged decode) against the gathered-context SDPA reference."""

import random

import pytest
import torch

from inference.engine.kernels.decode_attention import decode_attention, decode_attention_reference

# (n_heads, n_kv_heads, head_dim, block_size, window, partition_size, max_seq_len)
CASES = [
    (4, 4, 16, 1, None, 512, 40),  # MHA, one-slot blocks, one partition
    (6, 2, 16, 4, None, 16, 90),  # GQA 3, many partitions merged
    (8, 2, 32, 16, 7, 16, 120),  # GQA 4, window shorter than a partition
    (9, 3, 64, 16, 40, 16, 150),  # SmolLM2's heads, window over several partitions
    (8, 1, 24, 32, 1, 32, 70),  # GQA 8, head_dim not a power of two, window of one key
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "h{}-kv{}-d{}-bs{}-w{}-p{}-n{}".format(*c))
def test_decode_attention_matches_reference(case, dtype, seed, make_batch, tolerance):
    heads, kv_heads, head_dim, block_size, window, partition, max_len = case
    rng = random.Random(seed)
    batch = make_batch(
        rng, num_seqs=rng.randint(2, 5), num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, block_size=block_size, max_seq_len=max_len, dtype=dtype,
        decode=True, spare_columns=2,
    )  # fmt: skip
    num_seqs = batch.block_tables.shape[0]
    # The queries sit at shuffled rows of a larger batch: the rows of other sequences must stay
    # untouched, and every row the kernel owns must be written (NaN poison).
    rows = torch.randperm(num_seqs + 3)[:num_seqs].to(torch.int32)
    q = torch.randn(num_seqs + 3, heads, head_dim).to(dtype)
    q[rows.long()] = batch.q
    out = torch.full_like(q, float("nan"))
    bound = min(max_len + rng.randint(0, 20), batch.block_tables.shape[1] * block_size)
    bound = max(bound, int(batch.seq_lens.max()))
    args = (q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, rows)
    decode_attention(
        *args, block_size, batch.scale, max_seq_len=bound, window=window, out=out,
        partition_size=partition,
    )  # fmt: skip
    expected = decode_attention_reference(*args, block_size, batch.scale, window=window)
    owned = torch.zeros(q.shape[0], dtype=torch.bool)
    owned[rows.long()] = True
    assert not out[owned].isnan().any(), "a row the kernel owns was not written"
    assert out[~owned].isnan().all(), "the kernel wrote rows it does not own"
    torch.testing.assert_close(out[owned], expected[owned], **tolerance(dtype))


def test_a_padded_sequence_gets_zeros_and_its_neighbours_are_unaffected(make_batch):
    rng = random.Random(0)
    batch = make_batch(
        rng, num_seqs=3, num_heads=4, num_kv_heads=2, head_dim=16, block_size=4,
        max_seq_len=60, dtype=torch.float32, decode=True,
    )  # fmt: skip
    seq_lens = batch.seq_lens.clone()
    seq_lens[1] = 0  # a CUDA-graph batch padded up to its captured size
    rows = torch.arange(3, dtype=torch.int32)
    for partition in (16, 512):  # the merge kernel and the direct path
        out = torch.full_like(batch.q, float("nan"))
        args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, seq_lens, rows)
        decode_attention(*args, 4, batch.scale, max_seq_len=60, out=out, partition_size=partition)
        expected = decode_attention_reference(*args, 4, batch.scale)
        assert (out[1] == 0).all()
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_reads_a_window_table_that_starts_at_a_later_block(
    dtype, seed, window_batch, tolerance
):
    batch, window, tables, firsts = window_batch(
        seed, num_seqs=4, num_heads=8, dtype=dtype, decode=True
    )
    rows = torch.arange(4, dtype=torch.int32)
    args = (batch.q, batch.k_cache, batch.v_cache, tables, batch.seq_lens, rows, batch.block_size)
    out = decode_attention(
        *args, batch.scale, max_seq_len=int(batch.seq_lens.max()), window=window,
        partition_size=16, first_blocks=firsts,
    )  # fmt: skip
    expected = decode_attention_reference(*args, batch.scale, window=window, first_blocks=firsts)
    assert not expected.isnan().any() and not out.isnan().any(), "a dropped block was read"
    torch.testing.assert_close(out, expected, **tolerance(dtype))
