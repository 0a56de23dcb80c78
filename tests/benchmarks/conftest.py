"""Fixtures of the benchmarks' tests.

- `tokenizer`: the tokenizer and chat template of "smollm2-tiny-random" (the engine tests'
  `tiny_engine` model), without an engine.
"""

from __future__ import annotations

import pytest

from inference.engine.models import load_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer("smollm2-tiny-random")
