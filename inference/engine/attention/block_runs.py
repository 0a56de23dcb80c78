"""Runs of consecutive block ids in a block table, found without a Python loop per block.

The torch path plans every step from each sequence's block table (slot ranges to read in
place); a loop over blocks would cost a step Python time that grows with the context (~125
blocks a sequence at 2,000 tokens). numpy finds where the ids stop being consecutive, so the
Python that remains is per run (a few: the shared head, a tail, the blocks decoding added).
"""

from __future__ import annotations

import numpy as np


def block_runs(block_ids: list[int]) -> list[tuple[int, int]]:
    """[start, end) index ranges of `block_ids` whose ids go up by one, in order."""
    if not block_ids:
        return []
    breaks = (np.flatnonzero(np.diff(np.asarray(block_ids)) != 1) + 1).tolist()
    return list(zip([0, *breaks], [*breaks, len(block_ids)], strict=True))


def first_difference(lists: list[list[int]], limit: int) -> int:
    """How many leading entries (at most `limit`) every list shares with the first."""
    if limit <= 0:
        return 0
    first = np.asarray(lists[0][:limit])
    common = limit
    for other in lists[1:]:
        differs = np.flatnonzero(np.asarray(other[:limit]) != first)
        if differs.size:
            common = min(common, int(differs[0]))
    return common
