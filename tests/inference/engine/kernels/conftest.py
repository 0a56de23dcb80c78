"""Kernel tests: the triton kernels against their torch references, on CPU under triton's
interpreter.

The interpreter is chosen when `@triton.jit` decorates, and triton's own library functions are
decorated when triton is first imported: so these tests need TRITON_INTERPRET=1 in the
environment of the whole process, before anything imports triton. In the normal suite they are
not collected; `tests/inference/engine/test_kernels_interpreted.py` runs this directory in a
subprocess with the variable set, so it never reaches any other test. To run them directly:

    TRITON_INTERPRET=1 PYTHONPATH=$PWD .venv/bin/pytest tests/inference/engine/kernels -q

Fixtures:
- `seed`: a fresh random seed per test (fresh inputs each run), printed on failure.
- `make_batch(rng, ...)`: random ragged sequences laid out in a paged cache (`PagedBatch`).
- `window_batch(seed, ...)`: a random batch with a random block size and window, and its
  tables as a sliding layer lists them (from the block of each sequence's earliest visible key
  on, the blocks before NaN-poisoned): (batch, window, tables, first_blocks).
- `tolerance(dtype)`: assert_close tolerances against the fp32 reference for that input dtype
  (fp32 tight; fp16/bf16 allow their rounding of P before the P·V product).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import pytest
import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRETED:
    collect_ignore_glob = ["test_*.py"]

# Tolerances against the fp32 reference, per dtype of the inputs.
TOLERANCES = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=2e-2),
}


@pytest.fixture
def seed(request) -> int:
    value = random.SystemRandom().randrange(2**31)
    request.node.user_properties.append(("seed", value))
    print(f"seed={value}")  # shown by pytest for a failing test
    return value


@dataclass
class PagedBatch:
    q: torch.Tensor  # (T, H, D): each sequence's new tokens, one after another
    k_cache: torch.Tensor  # (num_blocks * block_size, KVH, D): random everywhere
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # (B, max_blocks) int32, blocks in random order
    seq_lens: torch.Tensor  # (B,) int32
    query_starts: torch.Tensor  # (B,) int32
    query_lens: torch.Tensor  # (B,) int32
    block_size: int

    @property
    def scale(self) -> float:
        return self.q.shape[-1] ** -0.5


def make_paged_batch(
    rng: random.Random,
    *,
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    max_seq_len: int,
    dtype: torch.dtype,
    decode: bool,
    spare_columns: int = 0,
) -> PagedBatch:
    """Ragged random sequences: lengths in [1, max_seq_len], query lengths 1 (decode) or in
    [1, length]; a cache with more blocks than needed; K/V/Q ~ N(0, 1)."""
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    seq_lens = [rng.randint(1, max_seq_len) for _ in range(num_seqs)]
    query_lens = [1 if decode else rng.randint(1, n) for n in seq_lens]
    blocks_needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_needed) + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks_needed) + spare_columns
    tables = torch.zeros(num_seqs, width, dtype=torch.int32)
    for b, n in enumerate(blocks_needed):
        tables[b, :n] = torch.tensor([order.pop() for _ in range(n)])
    shape = (num_blocks * block_size, num_kv_heads, head_dim)
    starts = [sum(query_lens[:b]) for b in range(num_seqs)]
    return PagedBatch(
        q=torch.randn(sum(query_lens), num_heads, head_dim, generator=gen).to(dtype),
        k_cache=torch.randn(shape, generator=gen).to(dtype),
        v_cache=torch.randn(shape, generator=gen).to(dtype),
        block_tables=tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_starts=torch.tensor(starts, dtype=torch.int32),
        query_lens=torch.tensor(query_lens, dtype=torch.int32),
        block_size=block_size,
    )


@pytest.fixture
def make_batch():
    return make_paged_batch


@pytest.fixture
def tolerance():
    return TOLERANCES.__getitem__


def window_block_tables(batch: PagedBatch, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row shifted to start at the block of its earliest visible key (first_blocks), the
    blocks it drops and the padding after its end pointing at NaN: reading them shows."""
    size = batch.block_size
    used = set(batch.block_tables.flatten().tolist())
    spare = next(b for b in range(batch.k_cache.shape[0] // size) if b not in used)
    tables = torch.full_like(batch.block_tables, spare)
    firsts = []
    for b, (seq_len, q_len) in enumerate(zip(batch.seq_lens, batch.query_lens, strict=True)):
        first = max(0, int(seq_len) - int(q_len) - window + 1) // size
        num_blocks = -(-int(seq_len) // size)
        tables[b, : num_blocks - first] = batch.block_tables[b, first:num_blocks]
        for block in [spare, *batch.block_tables[b, :first].tolist()]:
            batch.k_cache[block * size : (block + 1) * size] = float("nan")
            batch.v_cache[block * size : (block + 1) * size] = float("nan")
        firsts.append(first)
    return tables, torch.tensor(firsts, dtype=torch.int32)


def make_window_batch(
    seed: int, *, num_seqs: int, num_heads: int, dtype: torch.dtype, decode: bool
) -> tuple[PagedBatch, int, torch.Tensor, torch.Tensor]:
    """Sequences up to 150 long (2 kv heads of 32) in blocks of 4 or 16, and a window of 5, 16
    or 40 that drops their earliest blocks from the tables."""
    rng = random.Random(seed)
    block_size, window = rng.choice([4, 16]), rng.choice([5, 16, 40])
    batch = make_paged_batch(
        rng, num_seqs=num_seqs, num_heads=num_heads, num_kv_heads=2, head_dim=32,
        block_size=block_size, max_seq_len=150, dtype=dtype, decode=decode,
    )  # fmt: skip
    tables, firsts = window_block_tables(batch, window)
    return batch, window, tables, firsts


@pytest.fixture
def window_batch():
    return make_window_batch
