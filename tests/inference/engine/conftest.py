"""Fixtures shared by the engine tests.

- `smollm2_gguf_path`: the bundled SmolLM2-135M-Instruct GGUF file (tests using it are
  `real_model`).
- `smollm2_metadata`: that file's metadata as plain Python values, read once per session
  (reading the 49,152-entry vocabulary takes a few seconds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inference.engine.gguf_file import open_gguf, read_metadata
from inference.engine.model_files import gguf_path_for


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    return gguf_path_for("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2_metadata(smollm2_gguf_path: Path) -> dict[str, Any]:
    return read_metadata(open_gguf(smollm2_gguf_path))
