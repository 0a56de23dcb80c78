"""The kernel path of the engine's attention: the decode and prefill kernels over one
flattened batch, each writing its own sequences' rows of one output tensor."""

from __future__ import annotations

import torch

from inference.engine.kernels.decode_attention import decode_attention
from inference.engine.kernels.metadata import KernelMetadata
from inference.engine.kernels.prefill_attention import prefill_attention


def attend(
    q: torch.Tensor,  # (T, n_heads, head_dim)
    k_cache: torch.Tensor,  # (num_slots, n_kv_heads, head_dim), this step's K/V already stored
    v_cache: torch.Tensor,
    meta: KernelMetadata,
    scale: float,
    window: int | None = None,  # overrides meta.window
) -> torch.Tensor:
    window = window if window is not None else meta.window
    out = torch.empty_like(q)
    if meta.decode is not None:
        d = meta.decode
        decode_attention(
            q, k_cache, v_cache, d.block_tables, d.seq_lens, d.query_rows, meta.block_size,
            scale, max_seq_len=d.max_seq_len, window=window, out=out, first_blocks=d.first_blocks,
        )  # fmt: skip
    if meta.prefill is not None:
        p = meta.prefill
        prefill_attention(
            q, k_cache, v_cache, p.block_tables, p.seq_lens, p.query_starts, p.query_lens,
            meta.block_size, scale, max_query_len=p.max_query_len, window=window, out=out,
            first_blocks=p.first_blocks,
        )  # fmt: skip
    return out
