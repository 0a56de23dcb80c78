"""The disk tier: one immutable file per block in a directory that many engines (processes,
machines on a shared mount) read and write without locks.

Layout: <dir>/<layout key>-<key id>/<first 2 hex of the hash>/<chain hash hex>.kvb
(block_file); a sliding-window group's checkpoint marker (a window kept where that block ends)
is <hash>.kvc next to its blocks. Engines with another key (block_file.key_id) keep their files
in another directory, so they never read or delete each other's. A file's mtime is its last
use: set when written, refreshed on every hit. The sweeper (run by the writer thread, at most
once a minute) deletes, in this order:
1. temporary files older than an hour (a writer that died mid-write),
2. blocks not used for longer than the TTL,
3. while the directory holds more than its byte budget, the least recently used blocks.
Every engine sharing the directory sweeps it; deleting a file another one just deleted, or is
reading (POSIX keeps an open file readable), is harmless.

Nothing in the directory is trusted (safe_files, block_file): a link, a special file, a
forged, foreign or non-finite block is counted (`num_invalid`), deleted and recomputed. Reads
run on several loader threads at once (loader.py), so the stats are kept under a lock.

A directory that cannot be written (read-only, full, over quota) disables writes with one
warning; reads go on, and the engine serves as before. A directory whose reads keep failing
(I/O errors, reads that do not come back: the offloader reports those) turns the whole tier
off with one warning; the engine serves without it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time

import torch

from inference.engine.kv.hashing import BlockHash
from inference.engine.kv.tiers import safe_files
from inference.engine.kv.tiers.block_file import (
    BlockFileError,
    BlockLayout,
    decode_block,
    decode_marker,
    encode_block,
    encode_marker,
    is_finite,
    key_id,
)
from inference.engine.metrics import KVTierStats

logger = logging.getLogger(__name__)

SUFFIX = ".kvb"
MARKER_SUFFIX = ".kvc"
MAX_MARKER_BYTES = 1 << 12
STALE_TEMPORARY_S = 3600.0
# Reads that failed in a row (an I/O error, a read given up) before the tier is turned off.
MAX_CONSECUTIVE_FAILURES = 3
MAX_STUCK_PATHS = 1024  # files whose read did not come back: not read again
# Errors that say the directory cannot take writes (as opposed to one file's bad luck).
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class DiskTier:
    name = "disk"

    def __init__(
        self,
        directory: str,
        capacity_bytes: int,
        ttl_s: float,
        key: bytes | None = None,
        sweep_interval_s: float = 60.0,
    ) -> None:
        self.directory = os.path.abspath(directory)
        self.capacity_bytes = capacity_bytes
        self.ttl_s = ttl_s
        self.sweep_interval_s = sweep_interval_s
        if key is None:
            logger.warning(
                "KV disk tier: no kv_disk_cache_key (POKOMACHI_KV_KEY); this engine trusts only "
                "the files it writes itself, under a random key: no other process or machine "
                "shares its blocks, and it reuses none after a restart"
            )
            key = os.urandom(32)
        self.key = key
        self._key_id = key_id(key)
        self.stats = KVTierStats(self.name)
        self.last_sweep = float("-inf")
        self._lock = threading.Lock()  # the stats and the failure count: loader threads
        self._num_failures = 0  # reads failed in a row
        self._stuck: set[tuple[str, ...]] = set()
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as exc:
            self._disable_writes(exc)

    def names(self, layout: BlockLayout, block_hash: BlockHash, suffix: str = SUFFIX):
        """The file's names below the directory (safe_files' paths)."""
        name = block_hash.hex()
        return (f"{layout.key()}-{self._key_id}", name[:2], name + suffix)

    def path(self, layout: BlockLayout, block_hash: BlockHash) -> str:
        return os.path.join(self.directory, *self.names(layout, block_hash))

    def marker_path(self, layout: BlockLayout, block_hash: BlockHash) -> str:
        return os.path.join(self.directory, *self.names(layout, block_hash, MARKER_SUFFIX))

    @property
    def is_readable(self) -> bool:
        return not self.stats.reads_disabled

    # ---- reads (loader threads) -------------------------------------------------------------

    def get(
        self, layout: BlockLayout, block_hash: BlockHash, token_ids: tuple[int, ...]
    ) -> torch.Tensor | None:
        """The block's K/V if a valid file holds it with these tokens (its last use refreshed),
        else None; an unusable file is counted and deleted."""
        started = time.monotonic()
        names = self.names(layout, block_hash)
        raw = self._read(names, layout.max_file_bytes)
        if raw is None:
            self._count(num_misses=1)
            return None
        try:
            stored_tokens, payload = decode_block(self.key, layout, block_hash, raw)
        except BlockFileError as exc:
            self._reject(names, exc)
            self._count(num_misses=1)
            return None
        if stored_tokens != token_ids:  # a hash collision: not ours, not damaged
            self._count(num_misses=1)
            return None
        self._refresh(names)
        self._count(num_hits=1, bytes_read=len(raw), load_s=time.monotonic() - started)
        return payload

    def get_marker(self, layout: BlockLayout, block_hash: BlockHash) -> str | None:
        """The kind of the window checkpoint kept where this block ends, if one was written."""
        names = self.names(layout, block_hash, MARKER_SUFFIX)
        raw = self._read(names, MAX_MARKER_BYTES)
        if raw is None:
            return None
        try:
            kind = decode_marker(self.key, layout, block_hash, raw)
        except BlockFileError as exc:
            self._reject(names, exc)
            return None
        self._refresh(names)
        return kind

    def read_failed(self, reason: str, stuck: tuple[BlockLayout, BlockHash] | None = None) -> None:
        """A read failed or did not come back (`stuck`: the block it was reading, never read
        again); failures in a row turn the tier off."""
        with self._lock:
            self.stats.num_read_failures += 1
            self._num_failures += 1
            if stuck is not None and len(self._stuck) < MAX_STUCK_PATHS:
                self._stuck.add(self.names(*stuck))
            failures = self._num_failures
        if failures >= MAX_CONSECUTIVE_FAILURES:
            self.turn_off(f"{failures} reads in a row failed; the last: {reason}")

    def turn_off(self, reason: str) -> None:
        """Stop reading and writing the directory (once, with one warning)."""
        with self._lock:
            if self.stats.reads_disabled:
                return
            self.stats.reads_disabled = self.stats.writes_disabled = True
        logger.warning(
            "KV disk tier: %s keeps failing (%s); the disk tier is off, the engine serves "
            "without it",
            self.directory,
            reason,
        )

    def _read(self, names: tuple[str, ...], max_bytes: int) -> bytes | None:
        """The file's bytes, or None: missing, unusable (then counted and deleted), or the read
        failed (then counted as a failure)."""
        if not self.is_readable or names in self._stuck:
            return None
        try:
            raw = safe_files.read_regular(self.directory, names, max_bytes)
        except FileNotFoundError:
            self._succeeded()
            return None
        except safe_files.UnsafeFileError as exc:
            self._succeeded()
            self._reject(exc.names, exc)
            return None
        except OSError as exc:
            logger.warning("KV disk tier: cannot read %s (%s); recomputing", names[-1], exc)
            self.read_failed(str(exc))
            return None
        self._succeeded()
        return raw

    def _reject(self, names: tuple[str, ...], exc: Exception) -> None:
        logger.warning(
            "KV disk tier: %s is unusable (%s); deleted, recomputing", os.path.join(*names), exc
        )
        self._count(num_invalid=1)
        safe_files.remove(self.directory, names)

    def _refresh(self, names: tuple[str, ...]) -> None:
        """Its last use: keeps it from the TTL and the budget."""
        with contextlib.suppress(OSError):
            safe_files.touch(self.directory, names)

    def _succeeded(self) -> None:
        with self._lock:
            self._num_failures = 0

    def _count(self, **deltas: float) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)

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
        names = self.names(layout, block_hash)
        if safe_files.is_regular(self.directory, names):
            self._refresh(names)
            return
        if not is_finite(payload.contiguous().view(torch.uint8).numpy(), layout.dtype):
            return  # a reader would refuse it
        data = encode_block(self.key, layout, block_hash, token_ids, payload)
        if self._write(names, data):
            self._count(num_blocks=1, bytes_used=len(data), bytes_written=len(data))

    def put_marker(self, layout: BlockLayout, block_hash: BlockHash, kind: str) -> None:
        if self.stats.writes_disabled:
            return
        names = self.names(layout, block_hash, MARKER_SUFFIX)
        if safe_files.is_regular(self.directory, names):
            self._refresh(names)
            return
        self._write(names, encode_marker(self.key, layout, block_hash, kind))

    def _write(self, names: tuple[str, ...], data: bytes) -> bool:
        try:
            safe_files.write_atomic(self.directory, names, data)
            return True
        except OSError as exc:
            if exc.errno in _UNWRITABLE:
                self._disable_writes(exc)
            else:
                logger.warning("KV disk tier: writing %s failed (%s)", names[-1], exc)
            return False

    def maybe_sweep(self, now: float | None = None) -> None:
        """Sweep if the last sweep is older than the interval, or the directory (as counted)
        holds more than its budget."""
        if self.stats.reads_disabled:
            return
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
        files = []  # (mtime, size, names)
        for names, info in safe_files.walk(self.directory):
            if not names[-1].endswith((SUFFIX, MARKER_SUFFIX)):
                if ".tmp-" in names[-1] and now - info.st_mtime > STALE_TEMPORARY_S:
                    safe_files.remove(self.directory, names)
                continue
            if now - info.st_mtime > self.ttl_s:
                if safe_files.remove(self.directory, names):
                    self._count(num_expired=1)
                continue
            files.append((info.st_mtime, info.st_size, names))
        files.sort()
        total = sum(size for _, size, _ in files)
        kept = len(files)
        for _, size, names in files:
            if total <= self.capacity_bytes:
                break
            if safe_files.remove(self.directory, names):
                self._count(num_evictions=1)
            total -= size
            kept -= 1
        with self._lock:
            self.stats.num_blocks, self.stats.bytes_used = kept, total

    def make_stats(self) -> KVTierStats:
        with self._lock:
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
