"""Reading GGUF files: metadata as plain Python values, tensors dequantized to torch.

Everything GGUF-specific stays here; models and the tokenizer receive dicts. We parse the
header ourselves (gguf-py's reader builds a numpy view per vocabulary string, which takes
seconds for a 49k-token vocabulary) and hand the tensor bytes to `gguf.quants.dequantize`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

_MAGIC = b"GGUF"
_SCALARS = {  # GGUF value type → struct format
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
    12: "<d",
}  # fmt: skip
_STRING, _ARRAY = 8, 9
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
          6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}  # fmt: skip


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # PyTorch order (outermost first)
    qtype: GGMLQuantizationType
    offset: int  # from the start of the data section


@dataclass(frozen=True, slots=True)
class GGUFFile:
    path: Path
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_start: int


class _Cursor:
    def __init__(self, buffer: memoryview) -> None:
        self.buffer, self.pos = buffer, 0

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buffer, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        value = bytes(self.buffer[self.pos : self.pos + length]).decode("utf-8", errors="replace")
        self.pos += length
        return value

    def value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            item_type, count = self.unpack("<I"), self.unpack("<Q")
            if item_type in _NUMPY:  # numbers: one numpy read, not count struct calls
                dtype = np.dtype(_NUMPY[item_type])
                items = np.frombuffer(self.buffer, dtype, count, self.pos)
                self.pos += count * dtype.itemsize
                return items.tolist()
            return [self.value(item_type) for _ in range(count)]
        if value_type not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {value_type}")
        return self.unpack(_SCALARS[value_type])


def open_gguf(path: str | Path) -> GGUFFile:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"GGUF file not found: {path}")
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    cursor = _Cursor(memoryview(raw))
    if bytes(raw[:4]) != _MAGIC:
        raise ValueError(f"{path} is not a GGUF file (bad magic)")
    cursor.pos = 4
    version = cursor.unpack("<I")
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is not supported (need ≥ 2)")
    num_tensors, num_kv = cursor.unpack("<Q"), cursor.unpack("<Q")
    metadata = {}
    for _ in range(num_kv):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.unpack("<I"))
    tensors = []
    for _ in range(num_tensors):
        name = cursor.string()
        dims = [cursor.unpack("<Q") for _ in range(cursor.unpack("<I"))]
        qtype = GGMLQuantizationType(cursor.unpack("<I"))
        tensors.append(TensorInfo(name, tuple(reversed(dims)), qtype, cursor.unpack("<Q")))
    alignment = int(metadata.get("general.alignment", 32))
    data_start = -(-cursor.pos // alignment) * alignment
    return GGUFFile(path, metadata, tensors, data_start)


def read_metadata(gguf: GGUFFile) -> dict[str, Any]:
    """All key/value fields (strings as str, arrays as lists)."""
    return dict(gguf.metadata)


def read_tensors(gguf: GGUFFile, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Every tensor, dequantized, in PyTorch's (out, in) order."""
    raw = np.memmap(gguf.path, dtype=np.uint8, mode="r")
    tensors: dict[str, torch.Tensor] = {}
    for info in gguf.tensors:
        block_size, type_size = GGML_QUANT_SIZES[info.qtype]
        num_elements = int(np.prod(info.shape))
        num_bytes = num_elements // block_size * type_size
        start = gguf.data_start + info.offset
        # dequantize wants rows of bytes: (..., bytes per innermost row)
        row_bytes = info.shape[-1] // block_size * type_size
        data = raw[start : start + num_bytes].reshape(*info.shape[:-1], row_bytes)
        if info.qtype == GGMLQuantizationType.F32:
            array = data.view(np.float32).reshape(info.shape)
        else:
            array = dequantize(data, info.qtype).reshape(info.shape)
        array = np.array(array, dtype=np.float32)  # own, writable memory
        tensors[info.name] = torch.from_numpy(array).to(dtype)
    return tensors
