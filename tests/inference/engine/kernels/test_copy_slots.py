"""copy_slots (kernel) and its torch ops: copy-on-write of a block, checkpoint save/restore."""

import random

import pytest
import torch

from inference.engine.kernels.copy_slots import checkpoint_slots, copy_slots, cow_slots
from inference.engine.kernels.reference import copy_slots_reference

BLOCK = 4


def _stacked_cache(dtype, gen):
    # (2 layers × K/V, 16 blocks × BLOCK slots, 3 kv heads, 8): a view of a bigger tensor, so the
    # caches' stride is not their size.
    base = torch.randn(4, 16 * BLOCK + 5, 3, 8, generator=gen).to(dtype)
    return base[:, 5:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_copy_on_write_copies_the_first_n_slots_of_each_block(dtype, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    cache = _stacked_cache(dtype, gen)
    blocks = rng.sample(range(16), 6)
    copies = [(blocks[i], blocks[i + 3], rng.randint(1, BLOCK)) for i in range(3)]
    src, dst = cow_slots(copies, BLOCK, cache.device)
    expected = cache.clone()
    copy_slots_reference(expected, src, dst)
    before = cache.clone()
    copy_slots(cache, src, dst, use_kernel=True)
    assert torch.equal(cache, expected)
    changed = (cache != before).flatten(2).any(2).any(0)  # (num_slots,)
    assert set(changed.nonzero().flatten().tolist()) <= set(dst.tolist())
    for src_block, dst_block, n in copies:
        a, b = src_block * BLOCK, dst_block * BLOCK
        assert torch.equal(cache[:, b : b + n], before[:, a : a + n])
        assert torch.equal(cache[:, b + n : b + BLOCK], before[:, b + n : b + BLOCK])


@pytest.mark.parametrize("use_kernel", [True, False])
def test_checkpoint_save_then_restore_brings_the_window_back(use_kernel, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    cache = _stacked_cache(torch.float32, gen)
    live = rng.sample(range(8 * BLOCK), 7)  # a window's slots, scattered over live blocks
    save_src, save_dst = checkpoint_slots(live, [12, 14], BLOCK, cache.device)
    window = cache[:, live].clone()
    copy_slots(cache, save_src, save_dst, use_kernel=use_kernel)
    assert torch.equal(cache[:, save_dst], window)
    cache[:, live] = float("nan")  # the live blocks are overwritten by later tokens
    copy_slots(cache, save_dst, save_src, use_kernel=use_kernel)
    assert torch.equal(cache[:, live], window)


def test_bad_copies_are_refused():
    with pytest.raises(ValueError, match="cannot copy 5"):
        cow_slots([(0, 1, 5)], BLOCK, torch.device("cpu"))
    with pytest.raises(ValueError, match="do not fit"):
        checkpoint_slots(list(range(9)), [3, 4], BLOCK, torch.device("cpu"))
    cache = torch.zeros(2, 8, 2, 4)
    with pytest.raises(ValueError, match="length"):
        copy_slots(cache, torch.tensor([0, 1]), torch.tensor([2]))
    with pytest.raises(ValueError, match="contiguous"):
        copy_slots(cache.transpose(2, 3), torch.tensor([0]), torch.tensor([2]))
