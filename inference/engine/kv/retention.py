"""Retention policy: at which positions the sliding-window state is kept as a checkpoint.

vLLM's `--prefix-cache-retention-interval`, with its meaning: None keeps a checkpoint at every
block boundary (dense), 0 only where each prompt ends (rounded down to a full block), N > 0 at
multiples of N. A later request can resume a hybrid model only at a checkpoint, so its reuse
rounds down to this grid. Declared cache breakpoints and detected junctions are more positions,
kept whatever the interval and token-exact (not rounded to a block: see sliding_window_manager).

Dense with token-exact reuse keeps the window's state at every token, not only every block: all
of the window's blocks are kept, and the state at a position inside a kept block is those slots
of it (copied, as for any checkpoint inside a block). So a prompt that leaves a cached one
anywhere resumes exactly where it leaves, with no record needed there (`keeps_every_position`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference.engine.request import Request


def check_retention_interval(interval: int | None, block_size: int) -> None:
    """ValueError unless `interval` is None, 0, or a positive multiple of `block_size`."""
    if interval is None:
        return
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 0:
        raise ValueError(
            f"retention_interval must be None (dense), 0 (prompt end) or a positive multiple of "
            f"block_size ({block_size}), got {interval!r}"
        )
    if interval % block_size:
        nearest = max(interval // block_size, 1) * block_size
        raise ValueError(
            f"retention_interval ({interval}) must be a multiple of block_size ({block_size}): "
            f"checkpoints sit on block boundaries; try {nearest}"
        )


class RetentionPolicy:
    def __init__(self, interval: int | None, block_size: int, exact: bool = True) -> None:
        check_retention_interval(interval, block_size)
        self.interval = interval
        self.block_size = block_size
        # Without partial-block copies a checkpoint inside a block is unusable: round it down.
        self.exact = exact

    @property
    def keeps_every_position(self) -> bool:
        """Dense and token-exact: every position of a kept block is a checkpoint."""
        return self.interval is None and self.exact

    def describe(self) -> str:
        if self.interval is None:
            return "dense"
        return "prompt end" if self.interval == 0 else f"every {self.interval} tokens"

    def checkpoint_positions(
        self, request: Request, start: int, end: int, junctions: Sequence[int] = ()
    ) -> list[tuple[int, str]]:
        """(P, kind) for the positions P in (start, end] where a checkpoint of the window ending
        at P is kept once tokens [0, P) are computed, in order. kind: "retention" (the grid, on
        block boundaries), "breakpoint" (declared by the request) or "junction" (`junctions`,
        from the scheduler: where the request diverges from a cached prompt, or where requests
        waiting with it share a head)."""
        if end <= start:
            return []
        kinds: dict[int, str] = {}
        size = 1 if self.exact else self.block_size
        for position in junctions:
            kinds[position // size * size] = "junction"
        for position in request.cache_breakpoints:
            kinds[position // size * size] = "breakpoint"
        for position in self._grid(request, start, end):
            kinds.setdefault(position, "retention")
        return sorted((p, kind) for p, kind in kinds.items() if p and start < p <= end)

    def _grid(self, request: Request, start: int, end: int) -> list[int]:
        if self.interval == 0:
            prompt_end = request.num_prompt_tokens // self.block_size * self.block_size
            return [prompt_end] if start < prompt_end <= end else []
        step = self.interval or self.block_size
        first = (start // step + 1) * step
        return list(range(first, end + 1, step))
