"""The on-disk (and host-tier) form of one KV block: a header, the K/V bytes, a checksum.

    magic "PKKV" | u32 format version | u32 header length | header (JSON) | payload | u32 crc32

The header names what the bytes are (model fingerprint, group, block size, the payload's shape
and dtype, the chain hash and the block's tokens); the crc32 covers header and payload. A file
is used only when its magic, version, layout and checksum all match what the reader expects,
and its tokens match the request's (a hash hit also compares tokens): anything else raises
BlockFileError, and the caller deletes the file and recomputes the block.

Files are immutable and written whole under a temporary name, then renamed (atomic on POSIX,
also across processes and NFS clients): a reader sees no file or a complete one, and two
writers of the same block just replace identical bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import threading
import zlib
from dataclasses import dataclass

import torch

from inference.engine.kv.hashing import BlockHash

MAGIC = b"PKKV"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<4sII")  # magic, version, header length
_CRC = struct.Struct("<I")


class BlockFileError(ValueError):
    """A block file that must not be used: truncated, corrupt, foreign or another version."""


@dataclass(frozen=True, slots=True)
class BlockLayout:
    """What every block of one engine looks like: a file for another layout is foreign."""

    model_fingerprint: str
    group: str  # "full" or "sliding"
    block_size: int
    shape: tuple[int, ...]  # the payload's: (num_layers * 2, block_size, n_kv_heads, head_dim)
    dtype: str  # torch dtype name, e.g. "float32"

    @property
    def num_bytes(self) -> int:
        numel = 1
        for size in self.shape:
            numel *= size
        return numel * getattr(torch, self.dtype).itemsize

    def key(self) -> str:
        """A short name for this layout: its blocks live in a directory of their own."""
        text = json.dumps(
            [self.model_fingerprint, self.group, self.block_size, list(self.shape), self.dtype]
        )
        return f"{self.group}-{zlib.crc32(text.encode()):08x}"


def encode_block(
    layout: BlockLayout, block_hash: BlockHash, token_ids: tuple[int, ...], payload: torch.Tensor
) -> bytes:
    """One block's bytes: payload is its K/V, shaped and typed as the layout says."""
    assert tuple(payload.shape) == layout.shape, (tuple(payload.shape), layout.shape)
    header = json.dumps(
        {
            "model_fingerprint": layout.model_fingerprint,
            "group": layout.group,
            "block_size": layout.block_size,
            "shape": list(layout.shape),
            "dtype": layout.dtype,
            "block_hash": block_hash.hex(),
            "token_ids": list(token_ids),
        }
    ).encode()
    data = payload.contiguous().view(torch.uint8).numpy().tobytes()
    body = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)) + header + data
    return body + _CRC.pack(zlib.crc32(body))


def decode_block(
    layout: BlockLayout, block_hash: BlockHash, raw: bytes | bytearray
) -> tuple[tuple[int, ...], torch.Tensor]:
    """(token ids, payload) of a block's bytes; BlockFileError if anything does not match."""
    if len(raw) < _PREFIX.size + _CRC.size:
        raise BlockFileError(f"truncated: {len(raw)} bytes")
    magic, version, header_len = _PREFIX.unpack_from(raw)
    if magic != MAGIC:
        raise BlockFileError(f"not a KV block file (magic {magic!r})")
    if version != FORMAT_VERSION:
        raise BlockFileError(f"format version {version}, this engine reads {FORMAT_VERSION}")
    end = _PREFIX.size + header_len
    expected_size = end + layout.num_bytes + _CRC.size
    if len(raw) != expected_size:
        kind = "truncated" if len(raw) < expected_size else "oversized"
        raise BlockFileError(f"{kind}: {len(raw)} bytes, a block of this layout: {expected_size}")
    (crc,) = _CRC.unpack_from(raw, len(raw) - _CRC.size)
    if zlib.crc32(memoryview(raw)[: len(raw) - _CRC.size]) != crc:
        raise BlockFileError("checksum mismatch (corrupt)")
    header = json.loads(bytes(raw[_PREFIX.size : end]))
    found = (
        header["model_fingerprint"],
        header["group"],
        header["block_size"],
        tuple(header["shape"]),
        header["dtype"],
    )
    expected = (
        layout.model_fingerprint,
        layout.group,
        layout.block_size,
        layout.shape,
        layout.dtype,
    )
    if found != expected:
        raise BlockFileError(f"foreign block: {found}, this engine's {expected}")
    if header["block_hash"] != block_hash.hex():
        raise BlockFileError("stored under another block's name")
    payload = torch.frombuffer(
        bytearray(memoryview(raw)[end : end + layout.num_bytes]), dtype=getattr(torch, layout.dtype)
    )
    return tuple(header["token_ids"]), payload.view(layout.shape)


def write_atomic(path: str, data: bytes) -> None:
    """Write `data` to `path` whole or not at all: a temporary name in the same directory
    (unique per process and thread), then a rename. Raises OSError (the temporary is removed)."""
    temporary = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
