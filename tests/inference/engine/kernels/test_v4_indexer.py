"""v4_indexer (kernel) against v4_reference.indexer_scores_reference: ragged rows of visible
entries (a different count per query, holes, rows with none), pool rows no query sees
NaN-poisoned so that a read of one shows; fp32 and bf16."""

import random

import pytest
import torch

from inference.engine.kernels.v4_indexer import indexer_scores
from inference.engine.kernels.v4_reference import indexer_scores_reference


def _ragged_visible(rng: random.Random, num_queries: int, width: int, pool_rows: int):
    """(Q, width) pool rows, -1 padded: query 0 sees none, query 1 all `width`, the others a
    random count, some with a -1 hole inside their row (the kernel must not assume a prefix)."""
    visible = torch.full((num_queries, width), -1, dtype=torch.long)
    seen = rng.sample(range(pool_rows), width + 4)
    for t in range(1, num_queries):
        count = width if t == 1 else rng.randint(0, width)
        visible[t, :count] = torch.tensor(rng.sample(seen, count), dtype=torch.long)
        if count > 2 and t % 2:
            visible[t, rng.randrange(count)] = -1
    return visible, seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "head_dim", "width"), [(16, 32, 70), (4, 24, 9)])
def test_indexer_scores_match_the_reference(dtype, heads, head_dim, width, seed, tolerance):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_queries, pool_rows = 7, 96
    visible, seen = _ragged_visible(rng, num_queries, width, pool_rows)
    keys = torch.randn(pool_rows, head_dim, generator=gen).to(dtype)
    unseen = torch.ones(pool_rows, dtype=torch.bool)
    unseen[seen] = False
    keys[unseen] = float("nan")
    q = torch.randn(num_queries, heads, head_dim, generator=gen).to(dtype)
    weights = torch.randn(num_queries, heads, generator=gen) * heads**-0.5
    scale = head_dim**-0.5
    got = indexer_scores(q, weights, keys, visible.to(torch.int32), scale)
    want = indexer_scores_reference(q, weights, keys, visible, scale)
    padded = visible < 0
    assert torch.equal(torch.isneginf(got), padded)
    assert torch.isneginf(got[0]).all()  # the query that sees nothing
    torch.testing.assert_close(got[~padded], want[~padded], **tolerance(dtype))


def test_a_pool_in_another_dtype_than_q_is_widened(seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(3, 16, 16, generator=gen)
    keys = torch.randn(20, 16, generator=gen).to(torch.bfloat16)
    weights = torch.randn(3, 16, generator=gen)
    visible = torch.randint(-1, 20, (3, 5), generator=gen)
    got = indexer_scores(q, weights, keys, visible, 0.25)
    want = indexer_scores_reference(q, weights, keys, visible, 0.25)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(keys=torch.zeros(20, 8)), "head_dim"),
        (dict(weights=torch.zeros(3, 4)), "shape"),
        (dict(visible=torch.zeros(2, 5, dtype=torch.long)), "one per query"),
        (dict(visible=torch.zeros(3, 5)), "must be one of"),
    ],
)
def test_bad_inputs_are_refused(change, message):
    args = dict(
        q=torch.zeros(3, 16, 16),
        weights=torch.zeros(3, 16),
        keys=torch.zeros(20, 16),
        visible=torch.zeros(3, 5, dtype=torch.long),
    )
    args.update(change)
    with pytest.raises(ValueError, match=message):
        indexer_scores(**args, scale=1.0)
