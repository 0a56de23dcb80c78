"""The on-disk form of one KV block (and of a window checkpoint's marker): a header, the bytes,
a keyed MAC.

    magic "PKKV" | u32 format version | u32 header length | header (JSON) | payload | MAC

The header names what the bytes are (model fingerprint, group, block size, the payload's shape
and dtype, the chain hash, and the block's tokens or the checkpoint's kind); the MAC is
HMAC-SHA256, under the deployment's key, of everything before it. The directory is shared (a
mount every node writes), so a file is evidence, not truth: it is used only when its MAC is this
deployment's, its version and layout are what the reader expects, it is stored under its own
chain hash and its payload is finite; anything else raises BlockFileError, and the caller
deletes the file and recomputes the block. A crc32 would catch accidents only: anyone who can
write the directory can recompute one (format version 1 had it; such files are rejected as
another version). The tokens are compared by the caller (a hash hit also compares tokens).

Files are immutable and written whole under a temporary name, then renamed (atomic on POSIX,
also across processes and NFS clients): a reader sees no file or a complete one, and two
writers of the same block just replace identical bytes. Opening and reading them safely (no
links, no special files, bounded sizes) is safe_files'.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from inference.engine.kv.hashing import BlockHash

MAGIC = b"PKKV"
FORMAT_VERSION = 2
_PREFIX = struct.Struct("<4sII")  # magic, version, header length
MAC_BYTES = hashlib.sha256().digest_size
MAX_HEADER_BYTES = 1 << 16  # a header names a block's tokens; no legitimate one comes near this
# The bits of an IEEE float whose exponent is all ones (an infinity or a NaN), by KV dtype:
# checked with numpy on the integer view, which runs on the calling thread only (a torch op
# on a loader thread could start an OpenMP team beside the engine thread's; see writer.py).
_NON_FINITE = {
    "float32": (np.uint32, 0x7F800000),
    "float16": (np.uint16, 0x7C00),
    "bfloat16": (np.uint16, 0x7F80),
}


class BlockFileError(ValueError):
    """A block file that must not be used: truncated, corrupt, forged, foreign or another
    version."""


@dataclass(frozen=True, slots=True)
class BlockLayout:
    """What every block of one engine looks like: a file for another layout is foreign."""

    model_fingerprint: str
    group: str  # "full" or "sliding"
    block_size: int
    shape: tuple[int, ...]  # the payload's, as the paged state's block_shape gives it
    dtype: str  # torch dtype name, e.g. "float32"

    @property
    def num_bytes(self) -> int:
        numel = 1
        for size in self.shape:
            numel *= size
        return numel * getattr(torch, self.dtype).itemsize

    @property
    def max_file_bytes(self) -> int:
        """No valid block file of this layout is larger: reads stop here."""
        return _PREFIX.size + MAX_HEADER_BYTES + self.num_bytes + MAC_BYTES

    def key(self) -> str:
        """A short name for this layout: its blocks live in a directory of their own."""
        text = json.dumps(
            [self.model_fingerprint, self.group, self.block_size, list(self.shape), self.dtype]
        )
        return f"{self.group}-{zlib.crc32(text.encode()):08x}"

    def header(self, block_hash: BlockHash) -> dict:
        return {
            "model_fingerprint": self.model_fingerprint,
            "group": self.group,
            "block_size": self.block_size,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "block_hash": block_hash.hex(),
        }


def key_id(key: bytes) -> str:
    """A name for a key that does not reveal it: engines with different keys keep their files
    in different directories, so they never read (and delete) each other's."""
    return hmac.new(key, b"pokomachi kv key id", "sha256").hexdigest()[:12]


def encode_block(
    key: bytes,
    layout: BlockLayout,
    block_hash: BlockHash,
    token_ids: tuple[int, ...],
    payload: torch.Tensor,
) -> bytes:
    """One block's bytes: payload is its K/V, shaped and typed as the layout says."""
    assert tuple(payload.shape) == layout.shape, (tuple(payload.shape), layout.shape)
    header = {**layout.header(block_hash), "token_ids": list(token_ids)}
    return _seal(key, header, payload.contiguous().view(torch.uint8).numpy().tobytes())


def decode_block(
    key: bytes, layout: BlockLayout, block_hash: BlockHash, raw: bytes | bytearray
) -> tuple[tuple[int, ...], torch.Tensor]:
    """(token ids, payload) of a block's bytes; BlockFileError if anything does not match."""
    header, data = _open(key, layout, block_hash, raw, layout.num_bytes)
    token_ids = header.get("token_ids")
    if not isinstance(token_ids, list) or len(token_ids) != layout.block_size:
        raise BlockFileError(f"header names {token_ids!r} as the block's tokens")
    if not is_finite(data, layout.dtype):
        raise BlockFileError("payload holds NaN or infinite values")
    payload = torch.frombuffer(bytearray(data), dtype=getattr(torch, layout.dtype))
    return tuple(token_ids), payload.view(layout.shape)


def encode_marker(key: bytes, layout: BlockLayout, block_hash: BlockHash, kind: str) -> bytes:
    """A window checkpoint's marker: the checkpoint kept where the block `block_hash` ends."""
    return _seal(key, {**layout.header(block_hash), "checkpoint": kind}, b"")


def decode_marker(
    key: bytes, layout: BlockLayout, block_hash: BlockHash, raw: bytes | bytearray
) -> str:
    """The checkpoint kind a marker names; BlockFileError if anything does not match."""
    header, _ = _open(key, layout, block_hash, raw, 0)
    kind = header.get("checkpoint")
    if not isinstance(kind, str):
        raise BlockFileError(f"not a checkpoint marker (checkpoint {kind!r})")
    return kind


def is_finite(data: bytes | memoryview, dtype: str) -> bool:
    """Whether every value of a payload's bytes (of a float dtype) is finite."""
    int_type, mask = _NON_FINITE[dtype]
    bits = np.frombuffer(data, dtype=int_type)
    return not np.any((bits & int_type(mask)) == int_type(mask))


def _mac(key: bytes, body: bytes | memoryview) -> bytes:
    return hmac.new(key, body, "sha256").digest()


def _seal(key: bytes, header: dict, payload: bytes) -> bytes:
    encoded = json.dumps(header).encode()
    body = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(encoded)) + encoded + payload
    return body + _mac(key, body)


def _open(
    key: bytes, layout: BlockLayout, block_hash: BlockHash, raw: bytes | bytearray, size: int
) -> tuple[dict, memoryview]:
    """The header and payload (`size` bytes) of an authentic file for this layout and chain
    hash: the MAC is checked before anything of the file is parsed."""
    if len(raw) < _PREFIX.size + MAC_BYTES:
        raise BlockFileError(f"truncated: {len(raw)} bytes")
    magic, version, header_len = _PREFIX.unpack_from(raw)
    if magic != MAGIC:
        raise BlockFileError(f"not a KV block file (magic {magic!r})")
    if version != FORMAT_VERSION:
        raise BlockFileError(f"format version {version}, this engine reads {FORMAT_VERSION}")
    if header_len > MAX_HEADER_BYTES:
        raise BlockFileError(f"header of {header_len} bytes (at most {MAX_HEADER_BYTES})")
    end = _PREFIX.size + header_len
    expected_size = end + size + MAC_BYTES
    if len(raw) != expected_size:
        kind = "truncated" if len(raw) < expected_size else "oversized"
        raise BlockFileError(f"{kind}: {len(raw)} bytes, a file of this layout: {expected_size}")
    view = memoryview(raw)
    if not hmac.compare_digest(_mac(key, view[: end + size]), bytes(view[end + size :])):
        raise BlockFileError(
            "authentication failed: corrupt, or not written with this deployment's "
            "kv_disk_cache_key"
        )
    try:
        header = json.loads(bytes(view[_PREFIX.size : end]))
        found = tuple(header[name] for name in ("model_fingerprint", "group", "block_size"))
        found += (tuple(header["shape"]), header["dtype"])
    except (ValueError, KeyError, TypeError) as exc:
        raise BlockFileError(f"unreadable header ({exc})") from None
    expected = (
        layout.model_fingerprint,
        layout.group,
        layout.block_size,
        layout.shape,
        layout.dtype,
    )
    if found != expected:
        raise BlockFileError(f"foreign block: {found}, this engine's {expected}")
    if header.get("block_hash") != block_hash.hex():
        raise BlockFileError("stored under another block's name")
    return header, view[end : end + size]
