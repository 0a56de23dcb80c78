"""DeepSeek-V4's attention: the sliding-window K=V branch every layer has, with sinks and the
grouped output projection; CSA's overlapping compressor and lightning indexer; HCA's compressor.
It reads and writes the request state laid out in deepseek_v4.state, every sequence of the step
in one batch: each query reads its own keys through the step's tables (deepseek_v4.step_tables),
padded with -1 and masked, so no layer loops over sequences. The attention itself is
kernels/v4_sparse_attention.py's triton kernel when the step's metadata says use_kernels (and
the indexer's scores v4_indexer.py's), reading each query's rows in place; else the torch path
computes the same a tile of consecutive queries at a time (deepseek_v4.query_tiles,
tiled_attention), each tile's keys gathered once.
"""

from __future__ import annotations

import torch
from torch import nn

from inference.engine.kernels.v4_reference import compress_pool_reference
from inference.engine.models.deepseek_v4.config import CSA, SLIDING, DeepseekV4Config
from inference.engine.models.deepseek_v4.layers import (
    RMSNorm,
    Rope,
    Rotary,
    apply_rope,
    unweighted_rms_norm,
)
from inference.engine.models.deepseek_v4.query_tiles import QueryTiles
from inference.engine.models.deepseek_v4.state import DeepseekV4Metadata, LayerState
from inference.engine.models.deepseek_v4.step_tables import ClosingWindows
from inference.engine.models.deepseek_v4.tiled_attention import (
    OwnKeys,
    SharedKeys,
    gather_rows,
    tiled_attention,
    tiled_indexer_scores,
)

# A chunk of queries (of tiles, on the torch path) reads at most about (queries, keys, head_dim)
# floats this many (64 MB in fp32), so a long prefill chunk does not gather all its keys at once.
GATHER_BUDGET = 1 << 24

# ---- compressors ------------------------------------------------------------------------------


class Compressor(nn.Module):
    """Pools each closed window of `rate` tokens into one entry: the softmax(gate + bias)
    weighted sum of the tokens' kv, RMS-normed, roped at the window's first position. With
    `overlap`, entry w pools window w-1's first series with window w's second (CSA's windows
    of width 2·rate, stride rate); the raw per-token (kv, gate) live in the window state."""

    def __init__(self, hidden: int, head_dim: int, rate: int, overlap: bool, eps: float) -> None:
        super().__init__()
        self.rate, self.head_dim, self.overlap = rate, head_dim, overlap
        width = 2 * head_dim if overlap else head_dim
        self.kv_proj = nn.Linear(hidden, width, bias=False)
        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.position_bias = nn.Parameter(torch.zeros(rate, width))
        self.kv_norm = RMSNorm(head_dim, eps)

    @property
    def projection_width(self) -> int:
        return 2 * self.kv_proj.out_features

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """(T, projection_width): each token's raw kv and gate, kept in the window state."""
        return torch.cat([self.kv_proj(x), self.gate_proj(x)], dim=-1)

    def pool(
        self,
        projections: torch.Tensor,  # (num_slots, columns): the layer's compressor inputs
        column: int,  # this compressor's first column in them
        closing: ClosingWindows,
        rotary: Rotary,
        use_kernels: bool,
    ) -> torch.Tensor:
        """(N, head_dim) fp32: each closing window's entry, roped at position rate · w
        (kernels/v4_reference.compress_pool_reference; v4_compress.py on the kernel path)."""
        rope = rotary(closing.windows * self.rate)  # (N, 1, rope_dim) cos and sin
        args = (
            projections,
            column,
            closing.slots,
            closing.prev_slots if self.overlap else None,
            self.position_bias,
            self.kv_norm.weight,
            self.kv_norm.eps,
            rope.cos[:, 0],
            rope.sin[:, 0],
        )
        if use_kernels:  # triton is imported only on the kernel path
            from inference.engine.kernels.v4_compress import compress_pool

            return compress_pool(*args)
        return compress_pool_reference(*args)


class Indexer(Compressor):
    """The lightning indexer: its own overlapping compressor at index_head_dim, and a score
    ∑_h w_{t,h} · ReLU(q_{t,h} · K_s) per query and entry; a query keeps the top-k entries."""

    def __init__(self, config: DeepseekV4Config) -> None:
        super().__init__(
            config.hidden_size, config.index_head_dim, config.csa_rate, True, config.rms_norm_eps
        )
        self.num_heads, self.topk = config.index_n_heads, config.index_topk
        self.q_b_proj = nn.Linear(config.q_lora_rank, self.num_heads * self.head_dim, bias=False)
        self.scorer = nn.Module()
        self.scorer.weights_proj = nn.Linear(config.hidden_size, self.num_heads, bias=False)

    def queries(
        self,
        x: torch.Tensor,  # (T, hidden)
        q_residual: torch.Tensor,  # (T, q_lora_rank)
        rope: Rope,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's indexer queries, roped, (T, H, D), and each head's weight (T, H) fp32:
        computed once a layer, then read by every chunk of queries."""
        q = self.q_b_proj(q_residual).view(-1, self.num_heads, self.head_dim)
        weights = self.scorer.weights_proj(x).float() * self.num_heads**-0.5
        return apply_rope(q, rope), weights

    def select(
        self,
        q: torch.Tensor,  # (Q, H, D): queries' rows of `queries`
        weights: torch.Tensor,  # (Q, H)
        keys: torch.Tensor,  # (pool entries, index_head_dim): the layer's indexer keys
        visible: torch.Tensor,  # (Q, E): pool rows each query may see, -1 padded
    ) -> torch.Tensor:
        """(Q, min(top-k, E)): the pool rows each query keeps, -1 where it has fewer, on the
        kernel path (the scores v4_indexer.py's, the top-k torch.topk; select_in_tiles is the
        torch path's)."""
        from inference.engine.kernels.v4_indexer import indexer_scores  # triton: kernel path only

        scores = indexer_scores(q, weights, keys, visible, self.head_dim**-0.5)  # (Q, E)
        picks = scores.topk(min(self.topk, visible.shape[1]), dim=-1).indices
        return visible.gather(1, picks)  # an unseeable pick stays -1

    def select_in_tiles(
        self,
        q: torch.Tensor,  # (tiles, size, H, D): queries' rows of `queries`, in tiles
        weights: torch.Tensor,  # (tiles, size, H)
        keys: SharedKeys,  # the indexer keys of the entries each tile sees
    ) -> torch.Tensor:
        """(tiles, size, min(top-k, E)): select's picks on the torch path, a tile at a time
        (deepseek_v4.tiled_attention.tiled_indexer_scores)."""
        scores = tiled_indexer_scores(q, weights, keys, self.head_dim**-0.5)  # (tiles, size, E)
        picks = scores.topk(min(self.topk, keys.rows.shape[1]), dim=-1).indices
        rows = keys.rows[:, None, :].expand_as(scores).gather(2, picks)
        return rows.masked_fill(~keys.mask.gather(2, picks), -1)  # an unseeable pick: -1


# ---- attention --------------------------------------------------------------------------------


class GroupedLinear(nn.Linear):
    """Block-diagonal projection: each of n_groups head groups to its own o_lora_rank slice."""

    def __init__(self, in_per_group: int, out_features: int, n_groups: int) -> None:
        super().__init__(in_per_group, out_features, bias=False)
        self.n_groups = n_groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, groups, in) → (T, groups · out)
        w = self.weight.view(self.n_groups, -1, x.shape[-1]).transpose(1, 2)  # (G, in, out/G)
        return torch.bmm(x.transpose(0, 1), w).transpose(0, 1).flatten(1)


class Attention(nn.Module):
    def __init__(self, config: DeepseekV4Config, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.window, self.eps = config.sliding_window, config.rms_norm_eps
        self.scale = config.head_dim**-0.5
        self.q_a_proj = nn.Linear(config.hidden_size, config.q_lora_rank, bias=False)
        self.q_a_norm = RMSNorm(config.q_lora_rank, config.rms_norm_eps)
        self.q_b_proj = nn.Linear(config.q_lora_rank, self.num_heads * self.head_dim, bias=False)
        self.kv_proj = nn.Linear(config.hidden_size, self.head_dim, bias=False)
        self.kv_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        in_per_group = self.num_heads * self.head_dim // config.o_groups
        self.o_a_proj = GroupedLinear(
            in_per_group, config.o_groups * config.o_lora_rank, config.o_groups
        )
        self.o_b_proj = nn.Linear(
            config.o_groups * config.o_lora_rank, config.hidden_size, bias=False
        )
        self.sinks = nn.Parameter(torch.zeros(self.num_heads))
        self.compressor: Compressor | None = None
        self.rate = config.rate_of(kind) if kind != SLIDING else 0
        if kind != SLIDING:
            self.compressor = Compressor(
                config.hidden_size, self.head_dim, self.rate, kind == CSA, config.rms_norm_eps
            )
            if kind == CSA:
                self.compressor.indexer = Indexer(config)

    def forward(
        self,
        x,
        positions,
        ropes,
        state: LayerState,
        meta: DeepseekV4Metadata,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(T, hidden): every query's output; with `rows` (R,), only theirs, (R, hidden). The
        layer's state (the window's K = V, the compressors' entries) is written for every token
        either way: later steps read it."""
        num_tokens = x.shape[0]
        rope = ropes.main if self.kind == SLIDING else ropes.compress
        q_residual = self.q_a_norm(self.q_a_proj(x))  # (T, q_lora_rank)
        q = self.q_b_proj(q_residual).view(num_tokens, self.num_heads, self.head_dim)
        q = apply_rope(unweighted_rms_norm(q, self.eps), rope)  # (T, H, D)
        kv = apply_rope(self.kv_norm(self.kv_proj(x))[:, None, :], rope)[:, 0]  # (T, D)
        state.window[meta.window_slots] = kv.to(state.window.dtype)
        if self.compressor is not None:
            self._compress(x, state, meta, ropes.compress_rotary)
        index_queries = None
        if self.kind == CSA:  # the indexer's queries, once for every chunk of queries below
            index_queries = self.compressor.indexer.queries(x, q_residual, rope)
        attend = self._attend_rows if meta.use_kernels else self._attend_tiles
        out = attend(q, index_queries, state, meta, rows)  # (T or R, H, D)
        # K = V carried RoPE into the output: undo it
        out = apply_rope(out, (rope if rows is None else rope.at(rows)).inverse())
        groups = self.o_a_proj.n_groups  # (T, G, H·D / G); T may be 0 (no row wanted)
        grouped = out.reshape(out.shape[0], groups, self.num_heads * self.head_dim // groups)
        return self.o_b_proj(self.o_a_proj(grouped))

    def _attend_rows(
        self, q, index_queries, state: LayerState, meta: DeepseekV4Metadata, rows=None
    ):
        """(T, H, D), or (R, H, D) for `rows`: the kernel path, each query over its own rows of
        the step's tables, read in place by the triton kernels (triton is imported only on this
        path)."""
        from inference.engine.kernels.v4_sparse_attention import sparse_attention

        tables = meta.tables
        window = tables.window_keys()  # (T, W) sliding slots
        entries = tables.visible_entries(self.kind, self.rate) if self.rate else None
        width = window.shape[1] + (entries.shape[1] if entries is not None else 0)
        step = max(1, GATHER_BUDGET // (width * self.head_dim))
        num_queries = q.shape[0] if rows is None else len(rows)
        out = q.new_empty(num_queries, *q.shape[1:])
        for lo in range(0, num_queries, step):  # query chunks, each over every sequence's
            done = slice(lo, lo + step)
            picks = done if rows is None else rows[done]
            keys = [(state.window, window[picks])]
            if self.kind == CSA:
                index_q, index_weights = index_queries
                picked = self.compressor.indexer.select(
                    index_q[picks], index_weights[picks], state.index_entries, entries[picks]
                )
                keys.append((state.entries, picked))
            elif entries is not None:
                keys.append((state.entries, entries[picks]))
            out[done] = sparse_attention(q[picks], keys, self.sinks, self.scale)
        return out

    def _attend_tiles(
        self, q, index_queries, state: LayerState, meta: DeepseekV4Metadata, rows=None
    ):
        """(T, H, D), or (R, H, D) for `rows`: the torch path, a tile of each sequence's
        consecutive queries at a time over the keys the tile shares (deepseek_v4.query_tiles,
        tiled_attention); with `rows`, only the tiles holding one of them."""
        out = torch.empty_like(q)
        for tiles in QueryTiles.of(meta.tables):
            picked = None if rows is None else tiles.holding(rows)  # tile indices, CPU
            num_tiles = tiles.num_tiles if picked is None else len(picked)
            if num_tiles == 0:
                continue
            entries = tiles.entries(meta.tables, self.kind, self.rate) if self.rate else None
            width = tiles.window_slots.shape[1] + (entries.rows.shape[1] if entries else 0)
            step = max(1, GATHER_BUDGET // (tiles.size * width * self.head_dim))
            for lo in range(0, num_tiles, step):  # chunks of tiles
                chunk = slice(lo, lo + step) if picked is None else picked[lo : lo + step]
                tile_rows = tiles.rows[chunk]  # (tiles, size): a padded query computes row 0's
                parts = [SharedKeys(state.window, *tiles.window_of(chunk))]
                if entries is not None:
                    shared = entries.of_tiles(chunk)
                    if self.kind == CSA:
                        index_q, index_weights = index_queries
                        picks = self.compressor.indexer.select_in_tiles(
                            gather_rows(index_q, tile_rows),
                            gather_rows(index_weights, tile_rows),
                            SharedKeys(state.index_entries, *shared),
                        )
                        parts.append(OwnKeys(state.entries, picks))
                    else:
                        parts.append(SharedKeys(state.entries, *shared))
                q_tiled = gather_rows(q, tile_rows)  # (tiles, size, H, D)
                tiled = tiled_attention(q_tiled, parts, self.sinks, self.scale)
                live = (tile_rows >= 0).flatten()
                out.index_copy_(0, tile_rows.flatten()[live], tiled.flatten(0, 1)[live])
        return out if rows is None else out[rows]

    def _compress(self, x, state: LayerState, meta: DeepseekV4Metadata, rotary: Rotary) -> None:
        """Store the new tokens' compressor inputs, then pool every window they close."""
        compressor, indexer = self.compressor, getattr(self.compressor, "indexer", None)
        projections = compressor.project(x)
        if indexer is not None:
            projections = torch.cat([projections, indexer.project(x)], dim=-1)
        state.projections[meta.window_slots] = projections.to(state.projections.dtype)
        closing = meta.tables.closing_windows(self.kind, self.rate)
        if closing.windows.numel() == 0:
            return
        use_kernels = meta.use_kernels
        entries = compressor.pool(state.projections, 0, closing, rotary, use_kernels)
        state.entries[closing.entry_rows] = entries.to(state.entries.dtype)
        if indexer is not None:
            split = compressor.projection_width  # the indexer's columns follow the compressor's
            keys = indexer.pool(state.projections, split, closing, rotary, use_kernels)
            state.index_entries[closing.entry_rows] = keys.to(state.index_entries.dtype)
