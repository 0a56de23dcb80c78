"""deepseek-v4-tiny-random with its step metadata's use_kernels set (the sparse attention, the
indexer's scores and the compressors' pooling in triton, interpreted) against the torch path:
the logits and the entries a step writes, from the same history (written by the torch path: the
interpreter takes about 0.1 s per query), for a step of a prefill chunk, decodes mid-window, at a
CSA window's close and at the first HCA window's."""

from __future__ import annotations

import copy
import random
from collections import Counter

import pytest
import torch

from inference.engine.attention.attention_backend import GroupSpans, ScheduledSpan
from inference.engine.kernels import v4_compress, v4_indexer, v4_sparse_attention
from inference.engine.models import load_model
from inference.engine.models.deepseek_v4.tiny import NAME
from tests.inference.engine.helpers import smollm2_tokens

BLOCK = 16
# (tokens before the step, tokens in it) per sequence.
STEP = [(0, 13), (127, 1), (130, 1), (7, 1), (60, 5)]
BLOCKS_EACH = -(-max(a + b for a, b in STEP) // BLOCK)


@pytest.fixture(scope="module")
def model():
    return load_model(NAME, torch.device("cpu")).model


def _run(model, state, prompts, parts, use_kernels: bool, rows=None) -> torch.Tensor:
    """One step over (sequence, start, length) parts, each sequence in blocks of its own: the
    logits at `rows` (every row's by default)."""
    slots, spans, query_start = [], [], 0
    for seq, start, length in parts:
        blocks = list(range(seq * BLOCKS_EACH, (seq + 1) * BLOCKS_EACH))
        slots += [blocks[p // BLOCK] * BLOCK + p % BLOCK for p in range(start, start + length)]
        spans.append(ScheduledSpan(query_start, length, start, blocks))
        query_start += length
    full, window = GroupSpans(slots, spans), GroupSpans(list(slots), spans)
    spec = model.config.paged_state_spec()
    meta = spec.metadata_builder(BLOCK, torch.device("cpu")).build(full, window)
    meta.use_kernels = use_kernels
    ids = [t for seq, start, n in parts for t in prompts[seq][start : start + n]]
    positions = [p for _, start, n in parts for p in range(start, start + n)]
    rows = torch.arange(len(ids)) if rows is None else rows
    return model(torch.tensor(ids), torch.tensor(positions), state.layers, meta, rows)


def _step_after_history(model, seed: int):
    """Random prompts for STEP, the step's parts, and a state holding each sequence's history
    (written by the torch path)."""
    rng = random.Random(seed)
    prompts = [smollm2_tokens(rng, start + n) for start, n in STEP]
    history = [(seq, 0, start) for seq, (start, _) in enumerate(STEP) if start]
    step = [(seq, start, n) for seq, (start, n) in enumerate(STEP)]
    num = len(STEP) * BLOCKS_EACH
    before = model.config.paged_state_spec().allocate(
        num, num, BLOCK, torch.float32, torch.device("cpu")
    )
    _run(model, before, prompts, history, use_kernels=False)
    return prompts, step, before


def test_the_kernel_path_gives_the_torch_paths_logits(model, monkeypatch):
    calls = Counter()
    kernels = (
        (v4_sparse_attention, "sparse_attention"),
        (v4_indexer, "indexer_scores"),
        (v4_compress, "compress_pool"),
    )
    for module, name in kernels:
        real = getattr(module, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    prompts, step, before = _step_after_history(model, seed=5)
    results = {}
    for use_kernels in (False, True):
        state = copy.deepcopy(before)
        results[use_kernels] = (_run(model, state, prompts, step, use_kernels), state)
    (torch_logits, torch_state), (kernel_logits, kernel_state) = results[False], results[True]
    # Each CSA layer scores and pools (main + indexer); each HCA layer pools (the step closes
    # the window of the 128th token).
    # Every layer attends with the kernel.
    num_layers = model.config.num_layers
    assert calls == {
        "sparse_attention": num_layers,
        "indexer_scores": 2,
        "compress_pool": 2 * 2 + 2,
    }
    torch.testing.assert_close(kernel_logits, torch_logits, atol=1e-4, rtol=1e-4)
    for name in ("csa_entries", "csa_index_entries", "hca_entries"):
        torch.testing.assert_close(
            getattr(kernel_state, name), getattr(torch_state, name), atol=1e-5, rtol=1e-5
        )


def test_the_kernel_path_runs_the_last_layer_for_the_rows_asked(model):
    """The last layer's queries run for the logits' rows alone on the kernel path too: those
    rows' logits are the torch path's for every row, at those rows."""
    prompts, step, before = _step_after_history(model, seed=7)
    every = _run(model, copy.deepcopy(before), prompts, step, use_kernels=False)
    wanted = torch.tensor([0, len(every) - 1])
    some = _run(model, copy.deepcopy(before), prompts, step, use_kernels=True, rows=wanted)
    torch.testing.assert_close(some, every[wanted], atol=1e-4, rtol=1e-4)
