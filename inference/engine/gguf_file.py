"""Reading GGUF files: metadata as plain Python values, tensors dequantized to torch.

Everything GGUF-specific stays here; models and the tokenizer receive dicts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

_ARRAY_KEYS_KEPT_AS_LISTS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")


def open_gguf(path: str | Path) -> GGUFReader:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"GGUF file not found: {path}")
    return GGUFReader(path)


def read_metadata(reader: GGUFReader) -> dict[str, Any]:
    """All key/value fields, decoded (strings as str, arrays as lists)."""
    metadata: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        metadata[key] = field.contents()
    return metadata


def read_tensors(reader: GGUFReader, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Every tensor, dequantized, in PyTorch's (out, in) order.

    GGUF lists shapes innermost-first; `dequantize` already returns numpy's row-major
    shape (reversed), so a weight [in, out] in GGUF comes back as (out, in).
    """
    tensors: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        qtype = GGMLQuantizationType(tensor.tensor_type)
        array = dequantize(tensor.data, qtype)
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        array = np.require(array.reshape(shape), dtype=np.float32, requirements=["C", "W"])
        tensors[tensor.name] = torch.from_numpy(array).to(dtype)
    return tensors
