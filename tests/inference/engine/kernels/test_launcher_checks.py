"""The launchers refuse bad inputs with a ValueError that says what is wrong, before launch."""

import pytest
import torch

from inference.engine.kernels.decode_attention import decode_attention
from inference.engine.kernels.prefill_attention import prefill_attention
from inference.engine.kernels.store_kv import store_kv

CACHE = (32, 2, 16)  # 8 blocks of 4 slots, 2 kv heads, head_dim 16


def _decode_args(**changes):
    args = dict(
        q=torch.randn(3, 4, 16),
        k_cache=torch.randn(CACHE),
        v_cache=torch.randn(CACHE),
        block_tables=torch.zeros(3, 2, dtype=torch.int32),
        seq_lens=torch.ones(3, dtype=torch.int32),
        query_rows=torch.arange(3, dtype=torch.int32),
        block_size=4,
        scale=0.25,
        max_seq_len=8,
    )
    args.update(changes)
    return args


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(q=torch.randn(3, 4, 16, dtype=torch.float16)), "dtype"),
        (dict(q=torch.randn(3, 3, 16)), "multiple of n_kv_heads"),
        (dict(q=torch.randn(3, 4, 8)), "head_dim"),
        (dict(q=torch.randn(3, 16, 4).transpose(1, 2)), "contiguous in its last dimension"),
        (dict(v_cache=torch.randn(32, 2, 8)), "v_cache: shape"),
        (dict(block_tables=torch.zeros(3, 2)), "block_tables must be one of"),
        (dict(seq_lens=torch.ones(2, dtype=torch.int32)), "seq_lens: length"),
        (dict(query_rows=torch.arange(4)), "query_rows: length"),
        (dict(block_size=3), "power of two"),
        (dict(max_seq_len=9), "max_seq_len"),
        (dict(window=0), "window"),
        (dict(partition_size=24), "partition_size"),
        (dict(k_cache=[1, 2]), "must be a torch.Tensor"),
    ],
)
def test_decode_launcher_names_the_bad_input(changes, message):
    with pytest.raises(ValueError, match=message):
        decode_attention(**_decode_args(**changes))


def test_prefill_and_store_launchers_check_too():
    q = torch.randn(5, 4, 16)
    cache = torch.randn(CACHE)
    tables = torch.zeros(2, 2, dtype=torch.int32)
    lens = torch.tensor([3, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="query_lens: length"):
        prefill_attention(q, cache, cache, tables, lens, lens, lens[:1], 4, 0.25, max_query_len=3)
    with pytest.raises(ValueError, match="max_query_len"):
        prefill_attention(q, cache, cache, tables, lens, lens, lens, 4, 0.25, max_query_len=0)
    k = torch.randn(5, 2, 16)
    with pytest.raises(ValueError, match="slot_mapping: length"):
        store_kv(k, k, cache, cache, torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\(n_kv_heads, head_dim\)"):
        store_kv(torch.randn(5, 3, 16), torch.randn(5, 3, 16), cache, cache, lens)
