"""Small helpers shared by the engine tests."""

from __future__ import annotations

import random


def random_tokens(rng: random.Random, n: int) -> list[int]:
    """n token ids from the middle of Gemma's vocabulary (no special tokens)."""
    return [rng.randrange(1000, 200_000) for _ in range(n)]
