"""v4_compress (kernel) against v4_reference.compress_pool_reference: several windows closing at
once, CSA's overlap with and without a previous window, HCA's plain windows, the softmax over
one tile of window positions or several, a compressor's columns at an offset in the projections
row; slots no window reads and the columns of other compressors NaN-poisoned; fp32 and bf16."""

import random

import pytest
import torch

from inference.engine.kernels import v4_compress
from inference.engine.kernels.v4_compress import compress_pool
from inference.engine.kernels.v4_reference import compress_pool_reference

NUM_SLOTS = 160


def _inputs(rng, gen, *, num_windows, rate, head_dim, rope_dim, overlap, column, dtype):
    width = 2 * head_dim if overlap else head_dim
    columns = column + 2 * width + 6  # another compressor's columns on either side
    projections = torch.full((NUM_SLOTS, columns), float("nan"))
    order = rng.sample(range(NUM_SLOTS), 2 * num_windows * rate)
    slots = torch.tensor(order[: num_windows * rate]).view(num_windows, rate)
    prev_slots = torch.tensor(order[num_windows * rate :]).view(num_windows, rate)
    if overlap:
        prev_slots[0] = -1  # a window with no previous one (the first, or a replay's first)
        prev_slots[rng.randrange(1, num_windows)] = -1
    for rows in (slots, prev_slots[prev_slots[:, 0] >= 0] if overlap else slots):
        count = rows.numel()
        values = torch.randn(count, 2 * width, generator=gen) * 2
        projections[rows.flatten(), column : column + 2 * width] = values
    angles = torch.rand(num_windows, rope_dim // 2, generator=gen) * 6.28
    cos = angles.cos().repeat_interleave(2, dim=-1)  # pairs repeated, as the model's rotary
    sin = angles.sin().repeat_interleave(2, dim=-1)
    return dict(
        projections=projections.to(dtype),
        column=column,
        slots=slots.to(torch.int32),
        prev_slots=prev_slots if overlap else None,
        position_bias=(torch.randn(rate, width, generator=gen) * 0.5).to(dtype),
        norm_weight=(1 + 0.1 * torch.randn(head_dim, generator=gen)).to(dtype),
        eps=1e-6,
        cos=cos,
        sin=sin,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("kind", "rate", "head_dim", "rope_dim", "column"),
    [("csa", 4, 16, 8, 0), ("csa indexer", 4, 8, 8, 70), ("hca", 8, 16, 4, 0)],
)
@pytest.mark.parametrize("tile_elements", [8192, 32])  # one tile of positions, or several
def test_compress_pool_matches_the_reference(
    kind, rate, head_dim, rope_dim, column, tile_elements, dtype, seed, tolerance, monkeypatch
):
    monkeypatch.setattr(v4_compress, "TILE_ELEMENTS", tile_elements)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    args = _inputs(rng, gen, num_windows=5, rate=rate, head_dim=head_dim, rope_dim=rope_dim,
                   overlap=kind != "hca", column=column, dtype=dtype)  # fmt: skip
    got = compress_pool(**args)
    want = compress_pool_reference(**args)
    assert got.shape == (5, head_dim) and got.dtype == torch.float32
    assert torch.isfinite(want).all()
    torch.testing.assert_close(got, want, **tolerance(dtype))


def test_a_missing_previous_window_takes_no_weight(seed):
    """A window without a previous one pools alone: the same entry as with no overlap of it,
    whatever the previous slots' rows hold."""
    gen = torch.Generator().manual_seed(seed)
    args = _inputs(random.Random(seed), gen, num_windows=3, rate=4, head_dim=16, rope_dim=8,
                   overlap=True, column=0, dtype=torch.float32)  # fmt: skip
    args["prev_slots"][:] = -1
    got = compress_pool(**args)
    kv, gate = args["projections"][args["slots"].long(), : 2 * 32].chunk(2, dim=-1)
    gate = (gate + args["position_bias"])[..., 16:]
    alone = (kv[..., 16:] * gate.softmax(dim=1)).sum(dim=1)
    normed = alone * torch.rsqrt(alone.pow(2).mean(-1, keepdim=True) + 1e-6)
    normed = normed * args["norm_weight"]
    # Rope on the last 8 channels only: the first 8 are the normed pooling itself.
    torch.testing.assert_close(got[:, :8], normed[:, :8], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(position_bias=torch.zeros(4, 16)), "shape \\(rate, width\\)"),
        (dict(column=60), "past the projections"),
        (dict(prev_slots=torch.zeros(3, 4, dtype=torch.long)), "shape"),
        (dict(cos=torch.zeros(3, 8), sin=torch.zeros(3, 8)), "one per window"),
    ],
)
def test_bad_inputs_are_refused(change, message):
    args = dict(
        projections=torch.zeros(40, 64),
        column=0,
        slots=torch.zeros(2, 4, dtype=torch.long),
        prev_slots=torch.zeros(2, 4, dtype=torch.long),
        position_bias=torch.zeros(4, 32),
        norm_weight=torch.ones(16),
        eps=1e-6,
        cos=torch.ones(2, 8),
        sin=torch.zeros(2, 8),
    )
    args.update(change)
    with pytest.raises(ValueError, match=message):
        compress_pool(**args)
