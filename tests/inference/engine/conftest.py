"""Fixtures shared by the engine tests.

- `smollm2_gguf_path`: the bundled SmolLM2-135M-Instruct GGUF file (tests using it are
  `real_model`).
- `smollm2_metadata`: that file's metadata as plain Python values, read once per session
  (reading the 49,152-entry vocabulary takes a few seconds).
- `mid_v4_checkpoint`: a mid-size DeepSeek-V4 checkpoint in DeepSeek's layout (FP8 linears,
  FP4 experts, 64 MB shards, no tokenizer; benchmarks.load_checkpoint.mid_config: 0.43 GB packed,
  3.4 GB as fp32), written once per session (seconds) into a temporary directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inference.engine.loading.gguf_file import open_gguf, read_metadata
from inference.engine.loading.model_files import gguf_path_for


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    return gguf_path_for("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def mid_v4_checkpoint(tmp_path_factory) -> Path:
    from benchmarks.load_checkpoint import mid_config
    from inference.engine.models.deepseek_v4.packed_checkpoint import write_packed_checkpoint

    path = tmp_path_factory.mktemp("mid-v4")
    write_packed_checkpoint(path, mid_config(), seed=0)
    return path


@pytest.fixture(scope="session")
def smollm2_metadata(smollm2_gguf_path: Path) -> dict[str, Any]:
    return read_metadata(open_gguf(smollm2_gguf_path))


# - `tiny_engine` / `tiny_engine_uncached`: LLMEngine on "smollm2-tiny-random" (the real
#   tokenizer and chat template, a 2-layer random-weight llama), prefix caching on / off.
#   Shared by the session: tests must not depend on what is or is not cached from earlier
#   tests unless they use a fresh `cache_salt`.
# - `make_hybrid_engine`: build an LLMEngine on "gemma3-tiny-random" (5 sliding layers, window
#   512, and 1 global one) with overrides; module-scoped, so each module's engines are shut down
#   when it ends.
# - `smollm2_engine`: the real model, loaded once (`real_model` tests only).
# - `make_v4_engine`: build an LLMEngine on "deepseek-v4-tiny-random" with overrides (128
#   blocks, 128-token steps unless told); function-scoped.


def _engine(**overrides):
    from inference.engine import EngineConfig, LLMEngine

    config = dict(model="smollm2-tiny-random", num_kv_blocks=256, max_num_batched_tokens=64)
    config.update(overrides)
    return LLMEngine(EngineConfig(**config))


@pytest.fixture(scope="session")
def tiny_engine():
    engine = _engine()
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def tiny_engine_uncached():
    engine = _engine(enable_prefix_caching=False)
    yield engine
    engine.shutdown()


def _engines(**defaults):
    """A maker of engines with `defaults` and per-call overrides; shuts them all down after."""
    engines = []

    def make(**overrides):
        engines.append(_engine(**{**defaults, **overrides}))
        return engines[-1]

    yield make
    for engine in engines:
        engine.shutdown()


@pytest.fixture(scope="session")
def make_tiny_engine():
    """Build a tiny engine with overrides (e.g. num_kv_blocks=8); shut down at session end."""
    yield from _engines()


@pytest.fixture(scope="session")
def smollm2_engine():
    engine = _engine(model="smollm2-135m-instruct", max_num_batched_tokens=512, num_kv_blocks=None)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def make_hybrid_engine():
    yield from _engines(model="gemma3-tiny-random", num_kv_blocks=600, max_num_batched_tokens=512)


@pytest.fixture
def make_v4_engine():
    """Build an LLMEngine on "deepseek-v4-tiny-random" with overrides; shut down after the test."""
    yield from _engines(
        model="deepseek-v4-tiny-random", num_kv_blocks=128, max_num_batched_tokens=128
    )
