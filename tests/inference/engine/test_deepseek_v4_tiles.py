"""DeepSeek-V4's tiled torch path (deepseek_v4.query_tiles, tiled_attention) against the
kernels' references, which gather each query's own rows from the step's per-query tables:
a ragged step (a prefill from 0 over several tiles with a partial last one, a bounded replay's
chunk past its window start, decodes early and late, tiled apart) at several tile sizes, the
sliding window with compressed entries seen whole (HCA) or picked per query (CSA), and the
indexer's scores."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from inference.engine.kernels.reference import sparse_attention_reference
from inference.engine.kernels.v4_reference import indexer_scores_reference
from inference.engine.models.deepseek_v4 import query_tiles
from inference.engine.models.deepseek_v4 import tiled_attention as tiled_module
from inference.engine.models.deepseek_v4.config import CSA, HCA
from inference.engine.models.deepseek_v4.query_tiles import QueryTiles
from inference.engine.models.deepseek_v4.state import SequenceState
from inference.engine.models.deepseek_v4.step_tables import StepTables
from inference.engine.models.deepseek_v4.tiled_attention import (
    OwnKeys,
    SharedKeys,
    tiled_attention,
    tiled_indexer_scores,
)

BLOCK, WINDOW, CSA_RATE, HCA_RATE = 16, 32, 4, 16
HEADS, DIM = 4, 16
# (tokens before the step, tokens in it, window start) per sequence.
STEP = [(0, 37, 0), (50, 20, 40), (100, 1, 0), (7, 1, 0), (64, 3, 0)]


@dataclass
class Step:
    tables: StepTables
    groups: list[QueryTiles]
    window_pool: torch.Tensor  # (window slots, DIM)
    entry_pool: torch.Tensor  # (full blocks · CSA entries a block, DIM)


def _step(rng: random.Random) -> Step:
    """The step's tables over shuffled block ids, and random pools."""
    full_ids = list(range(100))
    window_ids = list(range(100))
    rng.shuffle(full_ids)
    rng.shuffle(window_ids)
    sequences, query_start = [], 0
    for start, length, window_start in STEP:
        end = start + length
        first = max(0, max(start - WINDOW + 1, window_start)) // BLOCK
        num_blocks = -(-end // BLOCK)
        blocks = [full_ids.pop() for _ in range(num_blocks)]
        window_blocks = [window_ids.pop() for _ in range(first, num_blocks)]
        sequences.append(
            SequenceState(query_start, length, start, blocks, window_blocks, first, window_start)
        )
        query_start += length
    tables = StepTables.build(sequences, BLOCK, BLOCK // CSA_RATE, WINDOW, torch.device("cpu"))
    return Step(
        tables,
        QueryTiles.of(tables),
        torch.randn(100 * BLOCK, DIM),
        torch.randn(100 * (BLOCK // CSA_RATE), DIM),
    )


def _in_tiles(values: torch.Tensor, tiles: QueryTiles) -> torch.Tensor:
    """(tiles, size, ...): each tile's queries' rows of `values` (row 0 where padded)."""
    return values[tiles.rows.clamp(min=0)]


def _gathered(step: Step, compute) -> tuple[torch.Tensor, torch.Tensor]:
    """`compute(tiles)` (tiles, size, ...) over each tile group: its live queries' rows, and
    their rows in the step."""
    got, rows = [], []
    for tiles in step.groups:
        live = tiles.rows >= 0
        got.append(compute(tiles)[live])
        rows.append(tiles.rows[live])
    return torch.cat(got), torch.cat(rows)


@pytest.fixture(params=[1, 8, 32], ids=lambda s: f"tile{s}")
def step(request, monkeypatch) -> Step:
    monkeypatch.setattr(query_tiles, "TILE_SIZE", request.param)
    return _step(random.Random(request.param))


def test_tiles_cover_each_query_once(step):
    rows = torch.cat([tiles.rows[tiles.rows >= 0] for tiles in step.groups])
    assert sorted(rows.tolist()) == list(range(sum(n for _, n, _ in STEP)))
    sizes = [tiles.size for tiles in step.groups]
    # The short sequences' (decodes, 3 queries) and the rest's.
    assert sizes == [min(query_tiles.TILE_SIZE, 3), min(query_tiles.TILE_SIZE, 37)]


def test_window_and_whole_entries_equal_the_gathered_reference(step):
    torch.manual_seed(0)
    tables = step.tables
    q, sinks = torch.randn(len(tables.query_positions()), HEADS, DIM), torch.randn(HEADS)
    want = sparse_attention_reference(
        q,
        [
            (step.window_pool, tables.window_keys()),
            (step.entry_pool, tables.visible_entries(HCA, HCA_RATE)),
        ],
        sinks,
        0.3,
    )

    def compute(tiles: QueryTiles) -> torch.Tensor:
        """Two tiles at a time, the entries cut to the most one of them sees (of_tiles)."""
        entries, q_tiled = tiles.entries(tables, HCA, HCA_RATE), _in_tiles(q, tiles)
        chunks = [slice(lo, lo + 2) for lo in range(0, tiles.num_tiles, 2)]
        return torch.cat(
            [
                tiled_attention(
                    q_tiled[chunk],
                    [
                        SharedKeys(step.window_pool, *tiles.window_of(chunk)),
                        SharedKeys(step.entry_pool, *entries.of_tiles(chunk)),
                    ],
                    sinks,
                    0.3,
                )
                for chunk in chunks
            ]
        )

    got, rows = _gathered(step, compute)
    torch.testing.assert_close(got, want[rows], rtol=1e-5, atol=1e-5)


def test_picked_entries_equal_the_gathered_reference(step):
    """CSA: each query's own picks (some -1) beside the window."""
    torch.manual_seed(1)
    tables = step.tables
    q, sinks = torch.randn(len(tables.query_positions()), HEADS, DIM), torch.randn(HEADS)
    visible = tables.visible_entries(CSA, CSA_RATE)  # (T, E)
    picks = visible.gather(1, torch.randint(0, visible.shape[1], (visible.shape[0], 3)))
    want = sparse_attention_reference(
        q, [(step.window_pool, tables.window_keys()), (step.entry_pool, picks)], sinks, 0.3
    )

    def compute(tiles: QueryTiles) -> torch.Tensor:
        own = _in_tiles(picks, tiles).masked_fill((tiles.rows < 0)[:, :, None], -1)
        return tiled_attention(
            _in_tiles(q, tiles),
            [
                SharedKeys(step.window_pool, *tiles.window_of(slice(None))),
                OwnKeys(step.entry_pool, own),
            ],
            sinks,
            0.3,
        )

    got, rows = _gathered(step, compute)
    torch.testing.assert_close(got, want[rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("per_pass", [None, 1], ids=["default-passes", "a-tile-a-pass"])
def test_indexer_scores_equal_the_gathered_reference(step, monkeypatch, per_pass):
    """Two tiles at a time, each pair's entries cut to the most one of them sees (of_tiles)."""
    if per_pass is not None:
        monkeypatch.setattr(tiled_module, "SCORES_PER_PASS", per_pass)
    torch.manual_seed(2)
    tables = step.tables
    num_tokens, heads = len(tables.query_positions()), 6
    q, weights = torch.randn(num_tokens, heads, DIM), torch.randn(num_tokens, heads)
    visible = tables.visible_entries(CSA, CSA_RATE)
    want = indexer_scores_reference(q, weights, step.entry_pool, visible, 0.25)

    def compute(tiles: QueryTiles) -> torch.Tensor:
        entries = tiles.entries(tables, CSA, CSA_RATE)
        q_tiled, weights_tiled = _in_tiles(q, tiles), _in_tiles(weights, tiles)
        width = want.shape[1]  # a chunk sees at most the step's entries: pad to compare
        parts = []
        for lo in range(0, tiles.num_tiles, 2):
            chunk = slice(lo, lo + 2)
            got = tiled_indexer_scores(
                q_tiled[chunk],
                weights_tiled[chunk],
                SharedKeys(step.entry_pool, *entries.of_tiles(chunk)),
                0.25,
            )
            parts.append(F.pad(got, (0, width - got.shape[-1]), value=float("-inf")))
        return torch.cat(parts)

    got, rows = _gathered(step, compute)
    assert torch.equal(got.isinf(), want[rows].isinf())
    torch.testing.assert_close(got, want[rows], rtol=1e-5, atol=1e-5)
