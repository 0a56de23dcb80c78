"""A step's gather tables for DeepSeek-V4's batched attention, built once per step from its
sequences and shared by every layer: which sliding slots each query reads, which windows the
step closes (their tokens' slots and their entry's pool row), and which compressed entries each
query may see. Padded entries hold the sentinel -1; attention masks them.

Each table is a few vectorized torch ops over (sequences, blocks) block tables: the per-step
cost does not grow with the sequences' lengths beyond the tables' own sizes, and no layer loops
over sequences (deepseek_v4.state says where each piece of state lives).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from inference.engine.models.deepseek_v4.config import CSA

PAD = -1


@dataclass(frozen=True, slots=True)
class ClosingWindows:
    """The compressor windows a step closes, over all its sequences (N of them)."""

    slots: torch.Tensor  # (N, rate): the window's tokens' sliding slots
    prev_slots: torch.Tensor  # (N, rate): the window before's (CSA's overlap), PAD where none
    windows: torch.Tensor  # (N,): each window's index w (its entry is roped at rate · w)
    entry_rows: torch.Tensor  # (N,): where its entry goes in the layer's entry pool


@dataclass(slots=True)
class StepTables:
    """Per-step tables in the sequences' own terms; `sequence_names` label errors."""

    block_size: int
    csa_entries_per_block: int
    window: int  # the sliding window W
    query_starts: torch.Tensor  # (S,)
    query_lens: torch.Tensor  # (S,)
    starts: torch.Tensor  # (S,) tokens computed before the step
    window_starts: torch.Tensor  # (S,)
    first_blocks: torch.Tensor  # (S,)
    full_table: torch.Tensor  # (S, max blocks) full-group block ids, PAD past each row's end
    window_table: torch.Tensor  # (S, max window blocks) sliding-group block ids, PAD past end
    device: torch.device
    _built: dict[tuple, object] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        sequences: Sequence,  # SequenceState
        block_size: int,
        csa_entries_per_block: int,
        window: int,
        device: torch.device,
    ) -> StepTables:
        def column(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long)

        query_starts = column([s.query_start for s in sequences])
        query_lens = column([s.query_len for s in sequences])
        if not torch.equal(query_starts, query_lens.cumsum(0) - query_lens):
            raise ValueError(
                "DeepSeek-V4's step tables need each sequence's queries right after the "
                f"previous one's: query starts {query_starts.tolist()}, lengths "
                f"{query_lens.tolist()}"
            )
        return cls(
            block_size,
            csa_entries_per_block,
            window,
            query_starts,
            query_lens,
            column([s.start for s in sequences]),
            column([s.window_start for s in sequences]),
            column([s.first_block for s in sequences]),
            _padded([s.block_ids for s in sequences]),
            _padded([s.window_block_ids for s in sequences]),
            device,
        )

    # ---- per query ----------------------------------------------------------------------------

    def _token_sequences(self) -> torch.Tensor:
        """(T,): each query's sequence index (CPU)."""
        return torch.repeat_interleave(torch.arange(len(self.query_lens)), self.query_lens)

    def query_positions(self) -> torch.Tensor:
        """(T,): each query's position in its sequence (CPU: for building tables)."""

        def build() -> torch.Tensor:
            seq = self._token_sequences()
            offsets = torch.arange(len(seq)) - self.query_starts[seq]
            return self.starts[seq] + offsets

        return self.once(("positions",), build, on_device=False)

    def window_keys(self) -> torch.Tensor:
        """(T, W): the sliding slots of the keys each query sees (positions p - W + 1 .. p),
        PAD before its sequence's window start or position 0."""

        def build() -> torch.Tensor:
            seq, pos = self._token_sequences(), self.query_positions()
            keys = pos[:, None] - self.window + 1 + torch.arange(self.window)  # (T, W)
            live = keys >= self.window_starts[seq, None].clamp(min=0)
            return self._window_slots(seq[:, None].expand_as(keys), keys, live)

        return self.once(("window",), build)

    def visible_entries(self, kind: str, rate: int) -> torch.Tensor:
        """(T, E): pool rows of the entries each query may see (windows its position closed),
        E the most any sequence of the step holds; PAD elsewhere."""

        def build() -> torch.Tensor:
            seq, pos = self._token_sequences(), self.query_positions()
            ends = self.starts + self.query_lens
            num_entries = int((ends // rate).max()) if len(ends) else 0
            entry = torch.arange(num_entries).expand(len(seq), -1)  # (T, E)
            visible = entry < ((pos + 1) // rate)[:, None]
            return self._entry_rows(kind, rate, seq[:, None].expand_as(entry), entry, visible)

        return self.once(("entries", kind, rate), build)

    # ---- per closing window -------------------------------------------------------------------

    def closing_windows(self, kind: str, rate: int) -> ClosingWindows:
        """The windows of `rate` tokens the step's queries close, every sequence's together."""

        def build() -> ClosingWindows:
            first = self.starts // rate
            last = (self.starts + self.query_lens) // rate
            counts = last - first
            seq = torch.repeat_interleave(torch.arange(len(counts)), counts)  # (N,)
            offsets = torch.arange(len(seq)) - (counts.cumsum(0) - counts)[seq]
            windows = first[seq] + offsets
            span = torch.arange(rate)
            tokens = rate * windows[:, None] + span  # (N, rate)
            every = torch.ones_like(tokens, dtype=torch.bool)
            slots = self._window_slots(seq[:, None].expand_as(tokens), tokens, every)
            # CSA pools window w - 1's first series too, where it exists (a bounded replay has
            # no window state before its start: its first window pools alone).
            has_prev = (windows > 0) & (
                (offsets > 0) | (rate * (windows - 1) >= self.window_starts[seq])
            )
            if kind != CSA:
                has_prev = torch.zeros_like(has_prev)
            prev = (tokens - rate).clamp(min=0)
            prev_slots = self._window_slots(seq[:, None].expand_as(prev), prev, has_prev[:, None])
            rows = self._entry_rows(kind, rate, seq, windows, torch.ones_like(has_prev))
            parts = (slots, prev_slots, windows, rows)
            return ClosingWindows(*(part.to(self.device) for part in parts))

        return self.once(("closing", kind, rate), build, on_device=False)

    # ---- lookups ------------------------------------------------------------------------------

    def _window_slots(self, seq: torch.Tensor, positions: torch.Tensor, live: torch.Tensor):
        """Sliding slots of `positions` (of sequences `seq`, same shape) where `live`, else PAD;
        ValueError naming the sequence where a live position has no slot in its table."""
        size = self.block_size
        index = positions.div(size, rounding_mode="floor") - self.first_blocks[seq]
        width = self.window_table.shape[1]
        blocks = self.window_table[seq, index.clamp(0, max(width - 1, 0))] if width else index
        missing = live & ((index < 0) | (index >= width) | (blocks < 0))
        if missing.any():
            bad = int(seq[missing][0])
            raise ValueError(
                f"sequence {bad} of the step reads position {int(positions[missing][0])}, "
                f"which its window blocks (from block {int(self.first_blocks[bad])}, "
                f"{int((self.window_table[bad] >= 0).sum())} blocks) do not hold: its state "
                "is inconsistent with its scheduled span"
            )
        return torch.where(live, blocks * size + positions % size, PAD)

    def _entry_rows(self, kind: str, rate: int, seq, entry: torch.Tensor, live: torch.Tensor):
        """Pool rows of entries `entry` of sequences `seq` (same shape) where `live`, else PAD:
        CSA's entry w in the block of token rate · w, at w mod per-block; HCA's in the block of
        its last token, one a block. ValueError naming the sequence where a live entry lies
        past its blocks."""
        if kind == CSA:
            per = self.csa_entries_per_block
            block, offset = entry // per, entry % per
        else:
            block, offset, per = (rate * entry + rate - 1) // self.block_size, 0, 1
        width = self.full_table.shape[1]
        ids = self.full_table[seq, block.clamp(0, max(width - 1, 0))] if width else block
        missing = live & ((block >= width) | (ids < 0))
        if missing.any():
            bad = int(seq[missing][0])
            raise ValueError(
                f"sequence {bad} of the step has compressed entries past its "
                f"{int((self.full_table[bad] >= 0).sum())} blocks: its state is inconsistent "
                "with its scheduled span"
            )
        return torch.where(live, ids * per + offset, PAD)

    def once(self, key: tuple, build, on_device: bool = True):
        """`build()`'s value, built on the first call for `key` and kept for the step (every
        layer reads the same tables; deepseek_v4.query_tiles keeps its tiles here too)."""
        if key not in self._built:
            value = build()
            self._built[key] = value.to(self.device) if on_device else value
        return self._built[key]


def _padded(rows: list[list[int]]) -> torch.Tensor:
    """(len(rows), longest) long tensor, PAD past each row's end."""
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows], dtype=torch.long).view(
        len(rows), width
    )
