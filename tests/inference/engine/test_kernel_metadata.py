"""build_kernel_metadata: a step's sequences as the kernels' index tensors (plain torch)."""

import torch

from inference.engine.attention_backend import ScheduledSpan
from inference.engine.kernels.metadata import build_kernel_metadata


def test_decodes_and_prefills_get_their_own_tables_lengths_and_rows():
    spans = [
        ScheduledSpan(query_start=0, query_len=5, num_computed=16, block_ids=[7, 3]),
        ScheduledSpan(query_start=5, query_len=1, num_computed=40, block_ids=[1, 2, 9]),
        ScheduledSpan(query_start=6, query_len=1, num_computed=3, block_ids=[4]),
        ScheduledSpan(query_start=7, query_len=2, num_computed=0, block_ids=[5]),
    ]
    meta = build_kernel_metadata(spans, 16, torch.device("cpu"), window=8)
    d, p = meta.decode, meta.prefill
    assert d.query_rows.tolist() == [5, 6]
    assert d.seq_lens.tolist() == [41, 4] and d.max_seq_len == 41
    assert d.block_tables.tolist() == [[1, 2, 9], [4, 0, 0]]
    assert p.query_starts.tolist() == [0, 7] and p.query_lens.tolist() == [5, 2]
    assert p.seq_lens.tolist() == [21, 2] and p.max_query_len == 5
    assert p.block_tables.tolist() == [[7, 3], [5, 0]]
    assert d.first_blocks is None and p.first_blocks is None
    assert meta.window == 8 and meta.block_size == 16
    assert all(t.dtype == torch.int32 for t in (d.seq_lens, d.block_tables, p.query_lens))


def test_window_tables_carry_their_first_block():
    spans = [
        ScheduledSpan(0, 1, 70, [8, 9], first_block=3),
        ScheduledSpan(1, 1, 20, [2, 6]),
        ScheduledSpan(2, 4, 60, [11, 12], first_block=2),
    ]
    meta = build_kernel_metadata(spans, 16, torch.device("cpu"))
    assert meta.decode.first_blocks.tolist() == [3, 0]
    assert meta.prefill.first_blocks.tolist() == [2]
    only_decodes = build_kernel_metadata(spans[:2], 16, torch.device("cpu"))
    assert only_decodes.prefill is None and only_decodes.decode.block_tables.shape == (2, 2)
