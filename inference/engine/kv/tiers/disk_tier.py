"""The disk tier: one immutable file per block in a directory that many engines (processes,
machines on a shared mount) read and write without locks.

Layout: <dir>/<layout key>/<first 2 hex of the hash>/<chain hash hex>.kvb (block_file); a
sliding-window group's checkpoint marker (a window kept where that block ends) is <hash>.kvc
next to its blocks, a small JSON file. A file's
mtime is its last use: set when written, refreshed on every hit. The sweeper (run by the writer
thread, at most once a minute) deletes, in this order:
1. temporary files older than an hour (a writer that died mid-write),
2. blocks not used for longer than the TTL,
3. while the directory holds more than its byte budget, the least recently used blocks.
Every engine sharing the directory sweeps it; deleting a file another one just deleted, or is
reading (POSIX keeps an open file readable), is harmless.

A directory that cannot be written (read-only, full, over quota) disables writes with one
warning; reads go on, and the engine serves as before.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import time

import torch

from inference.engine.core.metrics import KVTierStats
from inference.engine.kv.hashing import BlockHash
from inference.engine.kv.tiers.block_file import (
    BlockFileError,
    BlockLayout,
    decode_block,
    encode_block,
    write_atomic,
)

logger = logging.getLogger(__name__)

SUFFIX = ".kvb"
MARKER_SUFFIX = ".kvc"
STALE_TEMPORARY_S = 3600.0
# Errors that say the directory cannot take writes (as opposed to one file's bad luck).
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class DiskTier:
    name = "disk"

    def __init__(
        self, directory: str, capacity_bytes: int, ttl_s: float, sweep_interval_s: float = 60.0
    ) -> None:
        self.directory = os.path.abspath(directory)
        self.capacity_bytes = capacity_bytes
        self.ttl_s = ttl_s
        self.sweep_interval_s = sweep_interval_s
        self.stats = KVTierStats(self.name)
        self.last_sweep = float("-inf")
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as exc:
            self._disable_writes(exc)

    def path(self, layout: BlockLayout, block_hash: BlockHash) -> str:
        name = block_hash.hex()
        return os.path.join(self.directory, layout.key(), name[:2], name + SUFFIX)

    def marker_path(self, layout: BlockLayout, block_hash: BlockHash) -> str:
        return self.path(layout, block_hash)[: -len(SUFFIX)] + MARKER_SUFFIX

    def get_marker(self, layout: BlockLayout, block_hash: BlockHash) -> str | None:
        """The kind of the window checkpoint kept where this block ends, if one was written."""
        path = self.marker_path(layout, block_hash)
        try:
            with open(path, "rb") as f:
                kind = json.loads(f.read())["kind"]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("KV disk tier: %s is unusable (%s); deleted", path, exc)
            self.stats.num_invalid += 1
            _unlink(path)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        return str(kind)

    def put_marker(self, layout: BlockLayout, block_hash: BlockHash, kind: str) -> None:
        if self.stats.writes_disabled:
            return
        path = self.marker_path(layout, block_hash)
        if os.path.exists(path):
            with contextlib.suppress(OSError):
                os.utime(path)
            return
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomic(path, json.dumps({"kind": kind}).encode())
        except OSError as exc:
            if exc.errno in _UNWRITABLE:
                self._disable_writes(exc)

    def __contains__(self, key: tuple[BlockLayout, BlockHash]) -> bool:
        return os.path.exists(self.path(*key))

    # ---- reads (load thread) ----------------------------------------------------------------

    def get(
        self, layout: BlockLayout, block_hash: BlockHash, token_ids: tuple[int, ...]
    ) -> torch.Tensor | None:
        """The block's K/V if a valid file holds it with these tokens (its last use refreshed),
        else None; a damaged or foreign file is counted and deleted."""
        started = time.monotonic()
        path = self.path(layout, block_hash)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            self.stats.num_misses += 1
            return None
        except OSError as exc:
            logger.warning("KV disk tier: cannot read %s (%s); recomputing", path, exc)
            self.stats.num_misses += 1
            return None
        try:
            stored_tokens, payload = decode_block(layout, block_hash, raw)
        except (BlockFileError, ValueError, KeyError) as exc:
            logger.warning("KV disk tier: %s is unusable (%s); deleted, recomputing", path, exc)
            self.stats.num_invalid += 1
            self.stats.num_misses += 1
            _unlink(path)
            return None
        if stored_tokens != token_ids:  # a hash collision: not ours, not damaged
            self.stats.num_misses += 1
            return None
        with contextlib.suppress(OSError):  # last use: keeps it from the TTL and the budget
            os.utime(path)
        self.stats.num_hits += 1
        self.stats.bytes_read += len(raw)
        self.stats.load_s += time.monotonic() - started
        return payload

    # ---- writes and sweeps (writer thread) --------------------------------------------------

    def put(
        self,
        layout: BlockLayout,
        block_hash: BlockHash,
        token_ids: tuple[int, ...],
        payload: torch.Tensor,
    ) -> None:
        """Write a block unless a file already holds it (then its last use is refreshed)."""
        if self.stats.writes_disabled:
            return
        path = self.path(layout, block_hash)
        if os.path.exists(path):
            with contextlib.suppress(OSError):
                os.utime(path)
            return
        data = encode_block(layout, block_hash, token_ids, payload)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomic(path, data)
        except OSError as exc:
            if exc.errno in _UNWRITABLE:
                self._disable_writes(exc)
            else:
                logger.warning("KV disk tier: writing %s failed (%s)", path, exc)
            return
        self.stats.num_blocks += 1
        self.stats.bytes_used += len(data)
        self.stats.bytes_written += len(data)

    def maybe_sweep(self, now: float | None = None) -> None:
        """Sweep if the last sweep is older than the interval, or the directory (as counted)
        holds more than its budget."""
        now = time.time() if now is None else now
        if now - self.last_sweep >= self.sweep_interval_s or (
            self.stats.bytes_used > self.capacity_bytes
        ):
            self.sweep(now)

    def sweep(self, now: float | None = None) -> None:
        """Delete stale temporaries, expired blocks, then least recently used ones past the
        budget (see the module docstring); recounts the directory."""
        now = time.time() if now is None else now
        self.last_sweep = now
        files = []  # (mtime, size, path)
        for path in _walk(self.directory):
            try:
                info = os.stat(path)
            except OSError:
                continue
            if not path.endswith((SUFFIX, MARKER_SUFFIX)):
                if ".tmp-" in path and now - info.st_mtime > STALE_TEMPORARY_S:
                    _unlink(path)
                continue
            if now - info.st_mtime > self.ttl_s:
                if _unlink(path):
                    self.stats.num_expired += 1
                continue
            files.append((info.st_mtime, info.st_size, path))
        files.sort()
        total = sum(size for _, size, _ in files)
        kept = len(files)
        for _, size, path in files:
            if total <= self.capacity_bytes:
                break
            if _unlink(path):
                self.stats.num_evictions += 1
            total -= size
            kept -= 1
        self.stats.num_blocks, self.stats.bytes_used = kept, total

    def make_stats(self) -> KVTierStats:
        return self.stats.snapshot()

    def _disable_writes(self, exc: OSError) -> None:
        if not self.stats.writes_disabled:
            logger.warning(
                "KV disk tier: %s cannot be written (%s); writes are off, blocks already there "
                "are still read",
                self.directory,
                exc,
            )
        self.stats.writes_disabled = True


def _walk(directory: str):
    for root, _, names in os.walk(directory):
        for name in names:
            yield os.path.join(root, name)


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False
