"""The in-place paged attention against plain SDPA over a gathered context."""

import random

import pytest
import torch

from inference.engine.attention.attention import (
    _sdpa_with_lse,
    paged_attention,
    reference_attention,
    write_kv,
)
from inference.engine.attention.attention_backend import GroupSpans, ScheduledSpan
from inference.engine.attention.torch_metadata import (
    TorchAttentionMetadata,
    TorchMetadataBuilder,
    plan_shared_prefix,
    plan_span,
)

H, KVH, D, BLOCK = 6, 2, 8, 4


def test_plan_span_reads_consecutive_blocks_in_place_and_gathers_the_rest(monkeypatch):
    monkeypatch.setattr("inference.engine.attention.torch_metadata.MIN_VIEW_SLOTS", 8)
    span = plan_span(0, 3, [5, 6, 7, 2, 9, 10], 22, BLOCK, torch.device("cpu"))
    # Blocks 5-7 → slots 20..32 in place; block 2 alone is gathered; 9-10 hold 6 cached slots.
    assert span.view_runs == [(20, 32)]
    assert span.gathered_slots.tolist() == [8, 9, 10, 11, 36, 37, 38, 39, 40, 41]
    assert span.num_cached == 22
    # One new token (decode): its own slot, already written, is read with the context.
    decode = plan_span(0, 1, [5, 6, 7, 2, 9, 10], 22, BLOCK, torch.device("cpu"))
    assert decode.num_cached == 23
    assert decode.gathered_slots.tolist()[-1] == 42


@pytest.mark.parametrize("seed", range(4))
def test_paged_attention_matches_sdpa_over_the_gathered_context(monkeypatch, seed):
    monkeypatch.setattr("inference.engine.attention.torch_metadata.MIN_VIEW_SLOTS", 8)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    num_blocks = 40
    k_cache = torch.zeros(num_blocks * BLOCK, KVH, D)
    v_cache = torch.zeros_like(k_cache)
    free = list(range(num_blocks))
    rng.shuffle(free)
    spans, slot_mapping, queries, contexts = [], [], [], []
    row = 0
    for _ in range(3):  # three sequences: cached context + new tokens, blocks in random order
        num_cached, q_len = rng.choice([0, 5, 16, 23]), rng.choice([1, 3, 9])
        n = num_cached + q_len
        blocks = [free.pop() for _ in range(-(-n // BLOCK))]
        if rng.random() < 0.5:
            blocks.sort()  # some sequences get consecutive blocks, read in place
        slots = torch.tensor([blocks[p // BLOCK] * BLOCK + p % BLOCK for p in range(n)])
        k_ctx, v_ctx = torch.randn(n, KVH, D), torch.randn(n, KVH, D)
        write_kv(k_ctx[:num_cached], v_ctx[:num_cached], k_cache, v_cache, slots[:num_cached])
        spans.append(plan_span(row, q_len, blocks, num_cached, BLOCK, torch.device("cpu")))
        slot_mapping.append(slots[num_cached:])
        queries.append(torch.randn(q_len, H, D))
        contexts.append((k_ctx, v_ctx, num_cached))
        row += q_len
    q = torch.cat(queries)
    k_new = torch.cat([k[c:] for k, _, c in contexts])
    v_new = torch.cat([v[c:] for _, v, c in contexts])
    meta = TorchAttentionMetadata(torch.cat(slot_mapping), spans)
    write_kv(k_new, v_new, k_cache, v_cache, meta.slot_mapping)
    out = paged_attention(q, k_new, v_new, k_cache, v_cache, meta, D**-0.5)
    pairs = zip(queries, contexts, strict=True)
    expected = torch.cat([reference_attention(qs, k, v, D**-0.5) for qs, (k, v, _) in pairs])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


def test_portable_lse_path_matches_the_cpu_flash_op():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 5, D), torch.randn(1, 2, 5, D), torch.randn(1, 2, 5, D)
    for causal in (False, True):
        ours = _sdpa_with_lse(q, k, v, causal, 0.3)
        theirs = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, scale=0.3
        )
        torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ours[1], theirs[1], atol=1e-5, rtol=1e-4)


def test_shared_prefix_is_read_once_and_gives_the_same_result(monkeypatch):
    monkeypatch.setattr("inference.engine.attention.torch_metadata.MIN_VIEW_SLOTS", 8)
    torch.manual_seed(5)
    k_cache = torch.randn(64 * BLOCK, KVH, D)
    v_cache = torch.randn_like(k_cache)
    head = [3, 4, 5, 9]  # shared blocks (two runs: 3-5 in place, 9 gathered)
    own = {0: [20, 21], 1: [30], 2: [40, 41, 42]}
    lengths = {0: 4 * BLOCK + 6, 1: 4 * BLOCK + 2, 2: 4 * BLOCK + 9}  # contexts incl. new token
    device = torch.device("cpu")
    blocks = {i: head + own[i] for i in own}
    num_full = {i: (lengths[i] - 1) // BLOCK for i in own}
    shared, common = plan_shared_prefix(blocks, num_full, BLOCK, device)
    assert common == 4 and shared.span_indices == [0, 1, 2]
    assert shared.view_runs == [(12, 24)] and shared.gathered_slots.tolist() == list(range(36, 40))
    spans = [
        plan_span(i, 1, blocks[i], lengths[i] - 1, BLOCK, device, skip_blocks=common) for i in own
    ]
    q = torch.randn(3, H, D)
    k_new, v_new = torch.randn(3, KVH, D), torch.randn(3, KVH, D)
    slots = torch.tensor(
        [blocks[i][(lengths[i] - 1) // BLOCK] * BLOCK + (lengths[i] - 1) % BLOCK for i in own]
    )
    write_kv(k_new, v_new, k_cache, v_cache, slots)
    out = paged_attention(
        q, k_new, v_new, k_cache, v_cache, TorchAttentionMetadata(slots, spans, shared), D**-0.5
    )
    for i in own:
        ctx = torch.tensor([b * BLOCK + o for b in blocks[i] for o in range(BLOCK)][: lengths[i]])
        expected = reference_attention(q[i : i + 1], k_cache[ctx], v_cache[ctx], D**-0.5)
        torch.testing.assert_close(out[i : i + 1], expected, atol=1e-5, rtol=1e-4)


def _window_reference(q, k_all, v_all, q_positions, window, scale):
    """Dense SDPA over every position with the window mask (p-W, p]."""
    k_pos = torch.arange(k_all.shape[0])
    keep = (k_pos[None, :] <= q_positions[:, None]) & (
        k_pos[None, :] > q_positions[:, None] - window
    )
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        k_all.transpose(0, 1).unsqueeze(0),
        v_all.transpose(0, 1).unsqueeze(0),
        attn_mask=keep,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)


@pytest.mark.parametrize("seed", range(6))
def test_windowed_attention_matches_a_dense_window_mask(monkeypatch, seed):
    """Decode and chunked-prefill spans; some list only the blocks from mid-sequence on (as a
    sliding layer's cache does), in random block order, some read in place."""
    monkeypatch.setattr("inference.engine.attention.torch_metadata.MIN_VIEW_SLOTS", 8)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    window = rng.choice([5, 8, 13])
    H, KVH, D = rng.choice([(6, 2, 8), (4, 1, 16), (2, 2, 4)])  # heads, kv heads, head_dim
    num_blocks = 80
    k_cache = torch.full((num_blocks * BLOCK, KVH, D), float("nan"))  # unlisted slots poison
    v_cache = torch.full_like(k_cache, float("nan"))
    free = list(range(num_blocks))
    rng.shuffle(free)
    spans, slot_mapping, queries, expected, k_new, v_new = [], [], [], [], [], []
    row = 0
    for _ in range(4):
        num_cached, q_len = rng.choice([0, 3, 16, 23, 41]), rng.choice([1, 1, 4, 9])
        n = num_cached + q_len
        k_all, v_all = torch.randn(n, KVH, D), torch.randn(n, KVH, D)
        # The cache keeps the window's blocks only: from the first query's oldest visible key.
        oldest = max(0, num_cached - (1 if q_len == 1 else 0) - window + 1)
        first_position = oldest // BLOCK * BLOCK - rng.choice([0, BLOCK]) if oldest else 0
        first_position = max(first_position, 0)
        blocks = [free.pop() for _ in range(-(-(n - first_position) // BLOCK))]
        if rng.random() < 0.5:
            blocks.sort()
        slots = torch.tensor(
            [
                blocks[(p - first_position) // BLOCK] * BLOCK + p % BLOCK
                for p in range(first_position, n)
            ]
        )
        listed = num_cached - first_position
        write_kv(
            k_all[first_position:num_cached],
            v_all[first_position:num_cached],
            k_cache,
            v_cache,
            slots[:listed],
        )
        spans.append(
            plan_span(
                row,
                q_len,
                blocks,
                num_cached,
                BLOCK,
                torch.device("cpu"),
                first_position=first_position,
            )
        )
        slot_mapping.append(slots[listed:])
        qs = torch.randn(q_len, H, D)
        queries.append(qs)
        k_new.append(k_all[num_cached:])
        v_new.append(v_all[num_cached:])
        q_positions = torch.arange(num_cached, n)
        expected.append(_window_reference(qs, k_all, v_all, q_positions, window, D**-0.5))
        row += q_len
    meta = TorchAttentionMetadata(torch.cat(slot_mapping), spans)
    k_step, v_step = torch.cat(k_new), torch.cat(v_new)
    write_kv(k_step, v_step, k_cache, v_cache, meta.slot_mapping)
    out = paged_attention(
        torch.cat(queries), k_step, v_step, k_cache, v_cache, meta, D**-0.5, window=window
    )
    torch.testing.assert_close(out, torch.cat(expected), atol=1e-5, rtol=1e-4)


def test_windowed_attention_with_a_shared_decode_prefix(monkeypatch):
    """Decoding spans that share leading blocks (read once on full layers) still see exactly
    their window when the same metadata reaches a sliding layer."""
    monkeypatch.setattr("inference.engine.attention.torch_metadata.MIN_VIEW_SLOTS", 8)
    torch.manual_seed(0)
    window, shared_blocks = 10, [3, 4, 5]  # 12 shared positions, read in place
    k_cache, v_cache = torch.zeros(40 * BLOCK, KVH, D), torch.zeros(40 * BLOCK, KVH, D)
    k_head, v_head = torch.randn(12, KVH, D), torch.randn(12, KVH, D)
    write_kv(k_head, v_head, k_cache, v_cache, torch.arange(12, 24))
    decode_blocks, num_full, queries, expected, new_slots, k_new, v_new = {}, {}, [], [], [], [], []
    for i, (own, length) in enumerate([([20, 9], 17), ([30, 31], 20), ([11], 14)]):
        blocks = shared_blocks + own
        k_tail, v_tail = torch.randn(length - 12, KVH, D), torch.randn(length - 12, KVH, D)
        slots = torch.tensor([blocks[p // BLOCK] * BLOCK + p % BLOCK for p in range(12, length)])
        write_kv(k_tail[:-1], v_tail[:-1], k_cache, v_cache, slots[:-1])
        new_slots.append(slots[-1:])
        k_new.append(k_tail[-1:])
        v_new.append(v_tail[-1:])
        decode_blocks[i], num_full[i] = blocks, (length - 1) // BLOCK
        qs = torch.randn(1, H, D)
        queries.append(qs)
        k_all, v_all = torch.cat([k_head, k_tail]), torch.cat([v_head, v_tail])
        expected.append(
            _window_reference(qs, k_all, v_all, torch.tensor([length - 1]), window, D**-0.5)
        )
    shared, skip = plan_shared_prefix(decode_blocks, num_full, BLOCK, torch.device("cpu"))
    assert skip == 3
    spans = [
        plan_span(
            i,
            1,
            decode_blocks[i],
            length - 1,
            BLOCK,
            torch.device("cpu"),
            skip_blocks=skip,
        )
        for i, length in enumerate([17, 20, 14])
    ]
    meta = TorchAttentionMetadata(torch.cat(new_slots), spans, shared)
    k_step, v_step = torch.cat(k_new), torch.cat(v_new)
    write_kv(k_step, v_step, k_cache, v_cache, meta.slot_mapping)
    q = torch.cat(queries)
    out = paged_attention(q, k_step, v_step, k_cache, v_cache, meta, D**-0.5, window=window)
    torch.testing.assert_close(out, torch.cat(expected), atol=1e-5, rtol=1e-4)
    # A window longer than the whole context is plain causal attention: the full-layer path.
    full = paged_attention(q, k_step, v_step, k_cache, v_cache, meta, D**-0.5)
    wide = paged_attention(q, k_step, v_step, k_cache, v_cache, meta, D**-0.5, window=1000)
    torch.testing.assert_close(wide, full, atol=1e-5, rtol=1e-4)


def test_plan_span_rejects_a_first_position_off_the_block_grid():
    with pytest.raises(ValueError, match="first_position"):
        plan_span(0, 2, [1, 2], 9, BLOCK, torch.device("cpu"), first_position=3)


def test_builder_reads_a_shared_head_once_unless_the_decode_windows_do(monkeypatch):
    monkeypatch.setattr("inference.engine.attention.torch_metadata.MIN_VIEW_SLOTS", 8)
    head = [3, 4, 5]  # three blocks both decoding sequences start with
    spans = [
        ScheduledSpan(0, 4, 0, [7, 8]),  # a prefill: never part of the shared head
        ScheduledSpan(4, 1, 3 * BLOCK + 2, [*head, 20]),
        ScheduledSpan(5, 1, 3 * BLOCK + 1, [*head, 30]),
    ]
    full = GroupSpans(list(range(6)), spans)
    cpu = torch.device("cpu")
    meta = TorchMetadataBuilder(BLOCK, cpu, decode_windows=False).build(full, None)
    assert meta.shared.span_indices == [1, 2] and meta.shared.num_slots == 3 * BLOCK
    assert [s.cached_start for s in meta.spans] == [0, 3 * BLOCK, 3 * BLOCK]
    assert meta.decode is None and meta.sliding is None
    assert meta.slot_mapping.tolist() == list(range(6))
    windows = TorchMetadataBuilder(BLOCK, cpu).build(full, None)
    assert windows.shared is None and [s.cached_start for s in windows.spans] == [0, 0, 0]
    assert windows.decode.span_indices == [1, 2] and windows.decode.rows.tolist() == [4, 5]


def test_builder_plans_the_sliding_group_from_its_window_blocks():
    window = 2 * BLOCK
    # The decoding sequence's token 70 sees positions 63..70: its sliding table keeps its blocks
    # 15..17 only, and its listed context starts at position 60.
    decoding = dict(query_start=4, query_len=1, num_computed=70)
    full = GroupSpans(
        [28, 29, 30, 31, 150],
        [ScheduledSpan(0, 4, 0, [7]), ScheduledSpan(**decoding, block_ids=list(range(20, 38)))],
    )
    sliding = GroupSpans(
        [48, 49, 50, 51, 54],
        [
            ScheduledSpan(0, 4, 0, [12]),
            ScheduledSpan(**decoding, block_ids=[9, 11, 13], first_block=15),
        ],
    )
    builder = TorchMetadataBuilder(BLOCK, torch.device("cpu"), sliding_window=window)
    meta = builder.build(full, sliding)
    assert meta.decode.window is None and meta.spans[1].cached_start == 0
    sliding_meta = meta.sliding
    assert sliding_meta.slot_mapping.tolist() == [48, 49, 50, 51, 54]
    assert [s.cached_start for s in sliding_meta.spans] == [0, 15 * BLOCK]
    assert sliding_meta.spans[1].num_cached == 71
    assert sliding_meta.decode.window == window and sliding_meta.decode.span_indices == [1]
    assert sliding_meta.shared is None and sliding_meta.sliding is None
