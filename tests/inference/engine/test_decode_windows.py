"""Decode windows: every decoding sequence's context read together, against plain SDPA."""

import random

import pytest
import torch

from inference.engine import SamplingParams
from inference.engine.attention import decode_windows as decode_windows_module
from inference.engine.attention.attention import _flash_masked, reference_attention
from inference.engine.attention.decode_windows import decode_attention, plan_decode_batch, slot_runs
from tests.inference.engine.helpers import random_tokens

H, KVH, D, BLOCK = 6, 2, 8, 4
CPU = torch.device("cpu")


def test_slot_runs_join_consecutive_blocks_and_cut_the_last_one():
    assert slot_runs([5, 6, 2, 3, 9], 18, BLOCK) == [(20, 28), (8, 16), (36, 38)]
    assert slot_runs([7], 1, BLOCK) == [(28, 29)]
    # A sliding layer's table starts at block 2 (positions 8..); the window from position 10.
    assert slot_runs([5, 6, 9], 19, BLOCK, first=2, lowest=10) == [(22, 28), (36, 39)]


def test_runs_close_together_share_one_window_and_far_ones_do_not(monkeypatch):
    monkeypatch.setattr(decode_windows_module, "MAX_GAP", 8)
    monkeypatch.setattr(decode_windows_module, "MIN_WINDOW", 8)
    runs = [
        [(0, 16), (20, 24), (400, 402)],  # a head, a block 4 slots on, one far away
        [(0, 16), (28, 31)],  # the same head, its own block
        [(200, 240)],  # a sequence of its own far away
    ]
    batch = plan_decode_batch([0, 2, 3], [0, 5, 6], runs, CPU)
    assert batch.rows.tolist() == [0, 5, 6]
    in_place = [w for w in batch.windows if w.slots is None]
    assert [(w.start, w.mask.shape[1]) for w in in_place] == [(0, 31), (200, 40)]
    head = in_place[0]
    assert head.members.tolist() == [0, 1]
    assert head.mask[0].nonzero().flatten().tolist() == list(range(16)) + list(range(20, 24))
    assert head.mask[1].nonzero().flatten().tolist() == list(range(16)) + list(range(28, 31))
    # The lone 2-slot run is gathered, not given a window of its own.
    (gathered,) = [w for w in batch.windows if w.slots is not None]
    assert gathered.slots.tolist() == [400, 401] and gathered.members.tolist() == [0]


def test_a_window_never_reads_more_unused_slots_than_used_ones(monkeypatch):
    monkeypatch.setattr(decode_windows_module, "MAX_GAP", 8)
    monkeypatch.setattr(decode_windows_module, "MIN_WINDOW", 1)
    batch = plan_decode_batch([0], [0], [[(0, 4), (11, 15), (22, 26)]], CPU)
    # 4 used + 7 unused + 4 used; the next 7-slot gap would make 14 unused against 12 used.
    assert [(w.start, w.mask.shape[1]) for w in batch.windows] == [(0, 15), (22, 4)]


def _random_step(rng: random.Random, num_seqs: int, num_blocks: int, shared_blocks: int):
    """Sequences sharing `shared_blocks` head blocks, their other blocks from a shuffled pool
    (some consecutive, some scattered), each with its context length."""
    free = list(range(shared_blocks, num_blocks))
    rng.shuffle(free)
    head = list(range(shared_blocks))
    tables, lengths = [], []
    for _ in range(num_seqs):
        own = rng.randint(1, 6)
        blocks = [free.pop() for _ in range(own)]
        if rng.random() < 0.5:
            blocks.sort()
        tables.append(head + blocks)
        lengths.append(len(tables[-1]) * BLOCK - rng.randrange(BLOCK))
    return tables, lengths


@pytest.mark.parametrize("seed", range(12))
def test_decode_attention_matches_sdpa_over_each_context(monkeypatch, seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    # Small thresholds so that a small cache has several windows, gathered runs and slices.
    monkeypatch.setattr(decode_windows_module, "MAX_GAP", rng.choice([0, 8, 64]))
    monkeypatch.setattr(
        "inference.engine.attention.decode_windows.MIN_WINDOW", rng.choice([1, 8, 32])
    )
    monkeypatch.setattr(
        "inference.engine.attention.decode_windows.SPLITS", rng.choice([1, 2, 3, 4])
    )
    monkeypatch.setattr(
        "inference.engine.attention.decode_windows.MIN_SPLIT_LEN", rng.choice([1, 16])
    )
    num_blocks = 64
    k_cache = torch.randn(num_blocks * BLOCK, KVH, D)
    v_cache = torch.randn_like(k_cache)
    num_seqs = rng.randint(1, 5)
    tables, lengths = _random_step(rng, num_seqs, num_blocks, rng.choice([0, 2, 5]))
    # The decoding sequences sit among prefill rows in the flattened batch.
    rows = sorted(rng.sample(range(12), num_seqs))
    runs = [slot_runs(t, n, BLOCK) for t, n in zip(tables, lengths, strict=True)]
    batch = plan_decode_batch(list(range(num_seqs)), rows, runs, CPU)
    q = torch.randn(12, H, D)
    out = decode_attention(q, k_cache, v_cache, batch, D**-0.5, _flash_masked)
    for i, (table, n) in enumerate(zip(tables, lengths, strict=True)):
        ctx = torch.tensor([table[p // BLOCK] * BLOCK + p % BLOCK for p in range(n)])
        expected = reference_attention(q[rows[i]][None], k_cache[ctx], v_cache[ctx], D**-0.5)
        torch.testing.assert_close(out[i : i + 1], expected, atol=1e-5, rtol=1e-4)


def test_a_window_read_at_the_end_of_the_cache_is_shifted_back_not_past_it(monkeypatch):
    monkeypatch.setattr(decode_windows_module, "SPLITS", 4)
    monkeypatch.setattr(decode_windows_module, "MIN_SPLIT_LEN", 1)
    torch.manual_seed(1)
    k_cache, v_cache = torch.randn(40, KVH, D), torch.randn(40, KVH, D)
    batch = plan_decode_batch([0], [0], [[(31, 40)]], CPU)  # 9 slots, padded to 12
    q = torch.randn(1, H, D)
    out = decode_attention(q, k_cache, v_cache, batch, D**-0.5, _flash_masked)
    assert batch.windows[0].read.start == 28 and batch.windows[0].read.length == 12
    expected = reference_attention(q, k_cache[31:40], v_cache[31:40], D**-0.5)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


def test_engine_greedy_output_is_the_same_with_and_without_decode_windows(
    make_tiny_engine, monkeypatch
):
    rng = random.Random(3)
    head = [rng.randrange(1000, 40000) for _ in range(70)]
    prompts = [
        head + [rng.randrange(1000, 40000) for _ in range(rng.randint(5, 40))] for _ in range(5)
    ]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)

    def run(**config):
        return [o.token_ids for o in make_tiny_engine(**config).generate(prompts, params)]

    span_by_span = run(enable_decode_windows=False)
    assert run() == span_by_span
    # Every run its own window, slices of 3: the merges across windows and slices.
    monkeypatch.setattr(decode_windows_module, "MAX_GAP", 0)
    monkeypatch.setattr(decode_windows_module, "MIN_WINDOW", 1)
    monkeypatch.setattr(decode_windows_module, "SPLITS", 3)
    monkeypatch.setattr(decode_windows_module, "MIN_SPLIT_LEN", 1)
    assert run() == span_by_span


def test_hybrid_engine_greedy_output_is_the_same_with_and_without_decode_windows(
    make_hybrid_engine,
):
    """Gemma 3's sliding layers read only the window (p - W, p]: prompts past the window."""
    rng = random.Random(4)
    head = random_tokens(rng, 560)
    prompts = [head + random_tokens(rng, rng.randint(20, 90)) for _ in range(3)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)

    def run(**config):
        return [o.token_ids for o in make_hybrid_engine(**config).generate(prompts, params)]

    assert run() == run(enable_decode_windows=False)
