"""fp8_block_linear and fp4_grouped_matmul against the torch path (dequantize, fp32 matmul) on
ragged shapes; every e4m3 byte and e2m1 code decoded exactly; the launchers' refusals."""

import pytest
import torch

from inference.engine.kernels.quantized_matmul import (
    fp4_grouped_matmul,
    fp4_grouped_matmul_reference,
    fp8_block_linear,
    fp8_block_linear_reference,
)
from inference.engine.models.packed.formats import quantize_fp4, quantize_fp8


def assert_matches(got: torch.Tensor, want: torch.Tensor) -> None:
    """fp32 sums of K products in another order: a tolerance relative to the output's size (a
    wrong scale, nibble or row would be off by O(that size))."""
    assert got.dtype == torch.float32 and got.shape == want.shape
    size = max(1.0, want.abs().max().item())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5 * size)


def fp8_weight(gen, out_features, in_features, scale_kind):
    """A random weight quantized to e4m3 with its 128 x 128 scale grid (fp32, bf16 or e8m0
    bytes), or one scale for the whole weight ("single")."""
    w = torch.randn(out_features, in_features, generator=gen)
    weight, scale = quantize_fp8(w)
    if scale_kind == "bf16":
        scale = scale.bfloat16()
    elif scale_kind == "e8m0":
        scale = torch.randint(110, 130, scale.shape, generator=gen, dtype=torch.uint8)
    elif scale_kind == "single":
        scale = torch.tensor(0.0123)
    return weight, scale


# (M, N, K, x dtype, scale kind): M off the row tile; N and K off 128 (partial edge blocks)
FP8_CASES = [
    (37, 200, 300, torch.float32, "fp32"),
    (1, 130, 260, torch.bfloat16, "e8m0"),
    (70, 64, 129, torch.float16, "bf16"),
    (5, 96, 100, torch.float32, "single"),
    (16, 257, 128, torch.bfloat16, "fp32"),
]


@pytest.mark.parametrize("case", FP8_CASES, ids=lambda c: "m{}-n{}-k{}-{}-{}".format(*c))
def test_fp8_block_linear_matches_the_torch_path(case, seed):
    num_rows, out_features, in_features, dtype, scale_kind = case
    gen = torch.Generator().manual_seed(seed)
    weight, scale = fp8_weight(gen, out_features, in_features, scale_kind)
    # x a view with a row stride wider than K: the launcher passes strides, not assumptions.
    x = torch.randn(num_rows, in_features + 3, generator=gen).to(dtype)[:, :in_features]
    got = fp8_block_linear(x, weight, scale)
    assert_matches(got, fp8_block_linear_reference(x, weight, scale))


def test_fp8_decodes_every_byte_exactly():
    """All 256 e4m3fn bytes (subnormals, both zeros) through an identity x: each output is one
    weight value times its scale, nothing summed. Rows 2 and 3 hold the NaNs 0x7F and 0xFF
    alone, which poison their whole output column (NaN x 0 is NaN) and no other."""
    weight = torch.zeros(4, 128, dtype=torch.uint8)
    weight[:2] = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(2, 128)
    weight[:2][(weight[:2] & 0x7F) == 0x7F] = 0
    weight[2, 5], weight[3, 9] = 0x7F, 0xFF
    weight = weight.view(torch.float8_e4m3fn)
    scale = torch.tensor([[0.75]])
    got = fp8_block_linear(torch.eye(128), weight, scale)
    want = fp8_block_linear_reference(torch.eye(128), weight, scale)
    assert got[:, 2:].isnan().all() and not got[:, :2].isnan().any()
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_fp8_block_size_other_than_128():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(90, 70, generator=gen)
    weight, scale = quantize_fp8(w, block=32)  # a (3, 3) grid
    x = torch.randn(9, 70, generator=gen)
    got = fp8_block_linear(x, weight, scale, block=32)
    assert_matches(got, fp8_block_linear_reference(x, weight, scale, block=32))


def fp4_experts(gen, num_experts, out_features, in_features):
    w = torch.randn(num_experts, out_features, in_features, generator=gen)
    packed, scale = quantize_fp4(w)
    # Spread the group scales so each group's scale matters (quantize_fp4 gives near-equal ones).
    scale = scale + torch.randint(0, 6, scale.shape, generator=gen, dtype=torch.uint8)
    return packed, scale


def offsets_of(counts, dtype=torch.int32):
    return torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=dtype)


# (rows per expert, N, K, x dtype): empty experts first, between and last; one expert with many
# rows (several row tiles); K a multiple of 32 but not of the 128-input tile; N off the 64 tile.
FP4_CASES = [
    ([0, 5, 0, 40, 1, 0], 70, 96, torch.float32),
    ([130, 2, 0, 9], 64, 160, torch.float32),
    ([3, 0, 0, 0, 0, 0, 0, 4], 33, 32, torch.bfloat16),
    ([1], 128, 256, torch.bfloat16),
    ([17, 17, 17], 20, 64, torch.float32),
]


@pytest.mark.parametrize("case", FP4_CASES, ids=lambda c: "rows{}-n{}-k{}-{}".format(*c))
def test_fp4_grouped_matmul_matches_the_torch_path(case, seed):
    counts, out_features, in_features, dtype = case
    gen = torch.Generator().manual_seed(seed)
    weight, scale = fp4_experts(gen, len(counts), out_features, in_features)
    x = torch.randn(sum(counts), in_features, generator=gen).to(dtype)
    offsets = offsets_of(counts, dtype=torch.int64 if seed % 2 else torch.int32)
    got = fp4_grouped_matmul(x, offsets, weight, scale)
    assert_matches(got, fp4_grouped_matmul_reference(x, offsets, weight, scale))


def test_fp4_rows_past_the_last_group_are_zero_and_an_all_empty_batch_is_all_zero():
    gen = torch.Generator().manual_seed(5)
    weight, scale = fp4_experts(gen, 3, 40, 64)
    x = torch.randn(12, 64, generator=gen)
    offsets = offsets_of([4, 0, 3])  # rows 7.. belong to no expert (padding)
    got = fp4_grouped_matmul(x, offsets, weight, scale)
    assert (got[7:] == 0).all() and (got[:7] != 0).all()
    assert_matches(got, fp4_grouped_matmul_reference(x, offsets, weight, scale))
    empty = fp4_grouped_matmul(x, offsets_of([0, 0, 0]), weight, scale)
    assert (empty == 0).all()


def test_fp4_decodes_every_code_and_scale_exactly():
    """All 16 e2m1 codes in both nibbles, under 16 different e8m0 scales, through an identity x."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(4, 64)  # (N, K / 2)
    scale = torch.arange(100, 116, dtype=torch.int32).to(torch.uint8).reshape(4, 4)  # (N, K/32)
    weight, scale = codes[None], scale[None]
    x = torch.eye(128)
    offsets = offsets_of([128])
    got = fp4_grouped_matmul(x, offsets, weight, scale)
    torch.testing.assert_close(
        got, fp4_grouped_matmul_reference(x, offsets, weight, scale), rtol=0, atol=0
    )


def _fp8_args(**changes):
    args = dict(
        x=torch.randn(3, 200),
        weight=torch.zeros(130, 200, dtype=torch.float8_e4m3fn),
        scale=torch.ones(2, 2),
    )
    args.update(changes)
    return args


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(x=torch.randn(3, 199)), "in_features"),
        (dict(x=torch.randn(200)), "x must have 2 dimensions"),
        (dict(x=torch.randn(200, 3).T), "x must be contiguous in its last dimension"),
        (dict(x=torch.zeros(3, 200, dtype=torch.int32)), "x must be one of"),
        (dict(weight=torch.zeros(130, 200)), "weight must be one of"),
        (dict(scale=torch.ones(1, 2)), r"scale: its grid \(1, 2\) .* \(expected \(2, 2\)\)"),
        (dict(scale=torch.ones(2, 2, dtype=torch.int32)), "scale must be one of"),
        (dict(scale=torch.ones(2, 2, 1)), "scale must have 2 dimensions"),
        (dict(block=96), "power of two"),
        (dict(scale=torch.ones(2, 2, device="meta")), "scale is on meta, expected cpu"),
        (dict(weight=[1, 2]), "weight must be a torch.Tensor"),
    ],
)
def test_fp8_launcher_names_the_bad_input(changes, message):
    with pytest.raises(ValueError, match=message):
        fp8_block_linear(**_fp8_args(**changes))


def _fp4_args(**changes):
    args = dict(
        x=torch.randn(6, 64),
        expert_offsets=torch.tensor([0, 2, 6], dtype=torch.int32),
        weight=torch.zeros(2, 16, 32, dtype=torch.uint8),
        scale=torch.full((2, 16, 2), 127, dtype=torch.uint8),
    )
    args.update(changes)
    return args


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(x=torch.randn(6, 62)), "in_features"),
        (dict(x=torch.randn(6, 64, dtype=torch.float16)), "x must be one of"),
        (dict(expert_offsets=torch.tensor([0, 6])), r"expert_offsets: length .* expected 3"),
        (dict(expert_offsets=torch.tensor([0.0, 2.0, 6.0])), "expert_offsets must be one of"),
        (dict(weight=torch.zeros(2, 16, 32)), "weight must be one of"),
        (dict(weight=torch.zeros(16, 32, dtype=torch.uint8)), "weight must have 3 dimensions"),
        (dict(scale=torch.full((2, 16, 4), 127, dtype=torch.uint8)), "one e8m0 byte per 32"),
        (dict(scale=torch.ones(2, 16, 2)), "scale must be one of"),
        (
            dict(weight=torch.zeros(2, 16, 32, dtype=torch.uint8, device="meta")),
            "weight is on meta, expected cpu",
        ),
        (
            dict(
                x=torch.randn(6, 48),
                weight=torch.zeros(2, 16, 24, dtype=torch.uint8),
                scale=torch.zeros(2, 16, 1, dtype=torch.uint8),
            ),
            "multiple of the FP4 group 32",
        ),
    ],
)
def test_fp4_launcher_names_the_bad_input(changes, message):
    with pytest.raises(ValueError, match=message):
        fp4_grouped_matmul(**_fp4_args(**changes))
