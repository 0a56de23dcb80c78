"""build_kernel_metadata and the kernel path's builder: a step's sequences as the kernels' index
tensors (plain torch)."""

import torch

from inference.engine.attention.attention_backend import GroupSpans, ScheduledSpan
from inference.engine.kernels.metadata import KernelMetadataBuilder, build_kernel_metadata


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


def test_builder_gives_the_sliding_group_its_own_slots_and_window_tables():
    full = GroupSpans(
        [40, 41, 42, 7], [ScheduledSpan(0, 3, 8, [2, 5]), ScheduledSpan(3, 1, 70, [1, 2, 3, 4, 6])]
    )
    sliding = GroupSpans(
        [8, 9, 10, 39],
        [ScheduledSpan(0, 3, 8, [0, 1]), ScheduledSpan(3, 1, 70, [7, 9], first_block=3)],
    )
    builder = KernelMetadataBuilder(16, torch.device("cpu"), sliding_window=32)
    meta = builder.build(full, sliding)
    assert meta.slot_mapping.tolist() == [40, 41, 42, 7]
    assert meta.tables.window is None and meta.tables.decode.block_tables.tolist() == [
        [1, 2, 3, 4, 6]
    ]
    assert meta.sliding.slot_mapping.tolist() == [8, 9, 10, 39]
    assert meta.sliding.tables.window == 32 and meta.sliding.sliding is None
    assert meta.sliding.tables.decode.first_blocks.tolist() == [3]
    assert meta.sliding.tables.prefill.block_tables.tolist() == [[0, 1]]
    assert builder.build(full, None).sliding is None
