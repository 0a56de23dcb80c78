"""store_kv against index_copy_: padded slots skipped, strided (fused-qkv) inputs."""

import random

import pytest
import torch

from inference.engine.kernels.store_kv import store_kv, store_kv_reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("num_kv_heads", "head_dim", "block_size"), [(2, 16, 4), (3, 24, 16)])
def test_store_kv_writes_exactly_the_mapped_slots(dtype, num_kv_heads, head_dim, block_size, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_slots, num_tokens = 8 * block_size, rng.randint(1, 20)
    # K and V as views of one fused projection, the way the model produces them.
    fused = torch.randn(num_tokens, 5 * num_kv_heads * head_dim, generator=gen).to(dtype)
    k = fused[:, : num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    v = fused[:, -num_kv_heads * head_dim :].view(num_tokens, num_kv_heads, head_dim)
    slots = torch.tensor(rng.sample(range(num_slots), num_tokens))
    padded = torch.rand(num_tokens, generator=gen) < 0.3
    slots[padded] = -1
    caches = [torch.full((num_slots, num_kv_heads, head_dim), float("nan"), dtype=dtype)]
    caches.append(caches[0].clone())
    expected = [c.clone() for c in caches]
    store_kv(k, v, *caches, slots.to(torch.int32))
    store_kv_reference(k, v, *expected, slots)
    written = slots[slots >= 0]
    for got, want in zip(caches, expected, strict=True):
        assert not got[written].isnan().any(), "a mapped slot was not written"
        torch.testing.assert_close(got, want, atol=0, rtol=0, equal_nan=True)  # a plain copy
    assert caches[0].isnan().flatten(1).all(1).sum() == num_slots - len(written)
