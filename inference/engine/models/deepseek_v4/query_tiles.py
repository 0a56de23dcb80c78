"""A step's queries in tiles, for DeepSeek-V4's torch attention path (deepseek_v4.tiled_attention).

A tile is up to `size` consecutive queries of one sequence. Its queries read keys from one
contiguous run of positions (the sliding window of its first query through its last query), and
their compressed entries are a prefix of the entries its last query sees: so a tile gathers its
keys once, (tiles, keys, D), and every query of it reads them through a mask, where the per-query
tables (deepseek_v4.step_tables) gather each query's own rows, (queries, keys, D). A prefill
chunk of n queries then gathers about n / size · (size + W) rows instead of n · W.

Built once per step from its StepTables and shared by every layer; padded entries hold the
sentinel -1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inference.engine.models.deepseek_v4.step_tables import PAD, StepTables
from inference.engine.models.deepseek_v4.tiled_attention import mask_bias

# Queries a tile holds at most: larger tiles gather fewer rows but compute more masked logits
# (a tile's queries each score size + W - 1 window keys, W of them live).
TILE_SIZE = 32
# Sequences with at most this many queries (decodes, a draft's verification) are tiled apart.
SHORT = 4


@dataclass(frozen=True, slots=True)
class TileEntries:
    """The compressed entries a step's tiles read, of one attention kind."""

    rows: torch.Tensor  # (tiles, E): pool rows of the entries the tile's last query sees, PAD
    visible: torch.Tensor  # (tiles, size, E) bool: query b of the tile sees entry e
    bias: torch.Tensor  # (tiles, size, E) fp32: tiled_attention.mask_bias(visible)
    counts: torch.Tensor  # (tiles,) CPU: the entries each tile sees (its rows' live prefix)

    def of_tiles(self, chunk: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """rows, visible and bias of the tiles `chunk`, cut to the most entries one of them
        sees: a chunk of a prefill's first tiles is not padded to what the step's last tile
        sees (the town workload's entries were 31% padding, 18% so cut)."""
        counts = self.counts[chunk]
        width = int(counts.max()) if len(counts) else 0
        return self.rows[chunk, :width], self.visible[chunk, :, :width], self.bias[chunk, :, :width]


@dataclass(slots=True)
class QueryTiles:
    """The step's queries as tiles of `size`, with the sliding keys each tile reads."""

    size: int
    rows: torch.Tensor  # (tiles, size): the step's query rows, PAD past the tile's last query
    window_slots: torch.Tensor  # (tiles, size + W - 1): sliding slots of the tile's keys, PAD
    window_mask: torch.Tensor  # (tiles, size, size + W - 1) bool: query b reads key j
    window_bias: torch.Tensor  # (tiles, size, size + W - 1) fp32: mask_bias(window_mask)
    live_queries: torch.Tensor  # (tiles, size) CPU: rows >= 0
    positions: torch.Tensor  # (tiles, size) CPU: each query's position (past the last: its own)
    last_positions: torch.Tensor  # (tiles,) CPU: the position of the tile's last query
    sequences: torch.Tensor  # (tiles,) CPU: each tile's sequence index
    _entries_built: dict[tuple[str, int], TileEntries] = field(default_factory=dict)

    @classmethod
    def of(cls, tables: StepTables) -> list[QueryTiles]:
        """The step's tile groups, built once and kept with its tables: the sequences of at
        most SHORT queries (decodes) in tiles of their longest, the others in tiles of up to
        TILE_SIZE, so a decode beside a prefill chunk is not padded to a chunk's tile."""
        return tables.once(("tiles",), lambda: cls.groups(tables), on_device=False)

    @classmethod
    def groups(cls, tables: StepTables) -> list[QueryTiles]:
        lens = tables.query_lens
        short = (lens > 0) & (lens <= SHORT)
        groups = []
        for members in (short.nonzero()[:, 0], (lens > SHORT).nonzero()[:, 0]):
            if len(members):
                size = min(TILE_SIZE, int(lens[members].max()))
                groups.append(cls.build(tables, members, size))
        return groups

    @classmethod
    def build(cls, tables: StepTables, members: torch.Tensor, size: int) -> QueryTiles:
        """Tiles of `size` over the sequences `members` (indices into the step's)."""
        lens, window = tables.query_lens, tables.window
        counts = -(-lens[members] // size)  # tiles per sequence
        seq = torch.repeat_interleave(members, counts)  # (tiles,)
        first = (
            torch.arange(len(seq)) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        ) * size
        span = torch.arange(size)
        live_queries = span < (lens[seq] - first)[:, None]  # (tiles, size)
        rows = tables.query_starts[seq, None] + first[:, None] + span
        rows = torch.where(live_queries, rows, PAD)  # (tiles, size)
        positions = tables.starts[seq, None] + first[:, None] + span  # (tiles, size)
        last = tables.starts[seq] + torch.minimum(first + size, lens[seq]) - 1  # (tiles,)
        # Key j of a tile is at its first query's position - W + 1 + j: query b reads keys
        # b .. b + W - 1 (the band), those at or past the window start and not past the last.
        keys = positions[:, :1] - window + 1 + torch.arange(size + window - 1)  # (tiles, K)
        live_keys = (keys >= tables.window_starts[seq, None].clamp(min=0)) & (keys <= last[:, None])
        slots = tables._window_slots(seq[:, None].expand_as(keys), keys, live_keys)
        offset = torch.arange(size + window - 1)[None, :] - span[:, None]  # (size, K)
        band = (offset >= 0) & (offset < window)
        mask = band & live_keys[:, None, :] & live_queries[:, :, None]
        device = tables.device
        mask = mask.to(device)
        return cls(
            size,
            rows.to(device),
            slots.to(device),
            mask,
            mask_bias(mask),
            live_queries,
            positions,
            last,
            seq,
        )

    def window_of(self, chunk: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """window_slots, window_mask and window_bias of the tiles `chunk`."""
        return self.window_slots[chunk], self.window_mask[chunk], self.window_bias[chunk]

    @property
    def num_tiles(self) -> int:
        return self.rows.shape[0]

    def holding(self, rows: torch.Tensor) -> torch.Tensor:
        """(K,) CPU: the indices of the tiles holding one of the query `rows`, in order."""
        held = torch.isin(self.rows, rows.to(self.rows.device)).any(dim=1)
        return held.nonzero()[:, 0].cpu()

    def entries(self, tables: StepTables, kind: str, rate: int) -> TileEntries:
        """The entries of `kind` (compress `rate`) each tile reads, built once per step: those
        its last query's position has closed, E the most any tile sees; each query sees those
        its own position has closed (deepseek_v4.step_tables.visible_entries, per tile)."""
        if (kind, rate) not in self._entries_built:
            self._entries_built[kind, rate] = self._entries(tables, kind, rate)
        return self._entries_built[kind, rate]

    def _entries(self, tables: StepTables, kind: str, rate: int) -> TileEntries:
        closed = (self.last_positions + 1) // rate  # (tiles,)
        num_entries = int(closed.max()) if len(closed) else 0
        entry = torch.arange(num_entries).expand(len(closed), -1)  # (tiles, E)
        live = entry < closed[:, None]
        rows = tables._entry_rows(kind, rate, self.sequences[:, None].expand_as(entry), entry, live)
        visible = entry[:, None, :] < ((self.positions + 1) // rate)[:, :, None]
        visible &= live[:, None, :] & self.live_queries[:, :, None]
        visible = visible.to(tables.device)
        return TileEntries(rows.to(tables.device), visible, mask_bias(visible), closed)
