"""Prompt lookup (n-gram) drafting, as vLLM's NgramProposer: the context's last n tokens are
looked for earlier in the context (prompt + output), and the tokens that followed them are the
draft. n runs from `max_n` down to `min_n`: the longest suffix that recurs wins.

Which occurrence: the latest one that still has a full draft after it (recent text is the
likelier continuation: a town decision copies the names it was just shown), else the earliest
(the longest continuation), which vLLM always takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

if TYPE_CHECKING:
    from inference.engine.request import Request


class NgramProposer:
    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram lengths need 1 ≤ min_n ≤ max_n, got {min_n} and {max_n}")
        self.min_n = min_n
        self.max_n = max_n

    def draft(self, request: Request, max_tokens: int) -> list[int]:
        return self.propose(request.all_token_ids, max_tokens)

    def propose(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        """Up to `max_tokens` draft tokens to follow `token_ids`; [] when no suffix recurs."""
        num = len(token_ids)
        if max_tokens < 1 or num <= self.min_n:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_n, num - 1), self.min_n - 1, -1):
            # Windows starting at 0 .. num-1-n: every earlier occurrence, not the suffix itself.
            windows = sliding_window_view(tokens[: num - 1], n)  # (num - n, n)
            starts = np.flatnonzero((windows == tokens[num - n :]).all(axis=1))
            if starts.size == 0:
                continue
            full = starts[starts + n + max_tokens <= num]
            start = int(full[-1] if full.size else starts[0]) + n
            return tokens[start : start + max_tokens].tolist()
        return []
