"""KV tier storage on real files and memory: the block file format, the disk tier's retention
(TTL by last use, then the byte budget, oldest last use first) and the host tier's LRU."""

from __future__ import annotations

import dataclasses
import os
import struct

import pytest
import torch

from inference.engine.kv.hashing import BlockHash, hash_block_tokens
from inference.engine.kv.tiers.block_file import (
    BlockFileError,
    BlockLayout,
    decode_block,
    encode_block,
)
from inference.engine.kv.tiers.disk_tier import DiskTier
from inference.engine.kv.tiers.host_tier import HostTier

LAYOUT = BlockLayout("model-a", "full", 4, (2, 4, 1, 8), "float32")
KEY = b"tests: a deployment's kv key"


def block(i: int) -> tuple[BlockHash, tuple[int, ...], torch.Tensor]:
    tokens = (i, i + 1, i + 2, i + 3)
    payload = torch.arange(64, dtype=torch.float32).view(LAYOUT.shape) + i
    return hash_block_tokens(None, tokens, b"x"), tokens, payload


def test_a_block_round_trips_and_every_kind_of_damage_is_refused():
    block_hash, tokens, payload = block(1)
    raw = encode_block(KEY, LAYOUT, block_hash, tokens, payload)
    got_tokens, got = decode_block(KEY, LAYOUT, block_hash, raw)
    assert got_tokens == tokens and torch.equal(got, payload)

    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0xFF
    version = bytearray(raw)
    version[4:8] = struct.pack("<I", 99)
    foreign = encode_block(
        KEY, dataclasses.replace(LAYOUT, model_fingerprint="model-b"), block_hash, tokens, payload
    )
    other_hash = hash_block_tokens(None, (9, 9, 9, 9), b"x")
    cases = {
        "truncated": raw[:-10],
        "corrupt": bytes(flipped),
        "format version 99": bytes(version),
        "foreign block": foreign,
    }
    for reason, damaged in cases.items():
        with pytest.raises(
            BlockFileError, match=reason if reason != "corrupt" else "authentication"
        ):
            decode_block(KEY, LAYOUT, block_hash, damaged)
    with pytest.raises(BlockFileError, match="another block's name"):
        decode_block(KEY, LAYOUT, other_hash, raw)


def test_disk_tier_reads_what_it_wrote_and_deletes_a_damaged_file(tmp_path):
    disk = DiskTier(str(tmp_path), 1 << 20, ttl_s=3600, key=KEY)
    block_hash, tokens, payload = block(1)
    disk.put(LAYOUT, block_hash, tokens, payload)
    assert torch.equal(disk.get(LAYOUT, block_hash, tokens), payload)
    assert disk.get(LAYOUT, block_hash, (0, 0, 0, 0)) is None  # other tokens: not a hit
    path = disk.path(LAYOUT, block_hash)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 1)
    assert disk.get(LAYOUT, block_hash, tokens) is None
    assert not os.path.exists(path)
    stats = disk.make_stats()
    assert (stats.num_hits, stats.num_misses, stats.num_invalid) == (1, 2, 1)


def test_sweep_expires_by_last_use_then_evicts_oldest_last_use_past_the_budget(tmp_path):
    blocks = [block(i) for i in range(5)]
    file_bytes = len(encode_block(KEY, LAYOUT, *blocks[0]))
    disk = DiskTier(str(tmp_path), capacity_bytes=2 * file_bytes, ttl_s=100)
    now = 1_000_000.0
    # Written at now-500 (0), now-50 (1), now-40 (2), now-30 (3), now-20 (4).
    for (block_hash, tokens, payload), age in zip(blocks, (500, 50, 40, 30, 20), strict=True):
        disk.put(LAYOUT, block_hash, tokens, payload)
        os.utime(disk.path(LAYOUT, block_hash), (now - age, now - age))
    # A hit refreshes block 1's last use: it becomes the newest.
    assert disk.get(LAYOUT, blocks[1][0], blocks[1][1]) is not None
    os.utime(disk.path(LAYOUT, blocks[1][0]), (now - 1, now - 1))

    disk.sweep(now)
    kept = [os.path.exists(disk.path(LAYOUT, b[0])) for b in blocks]
    # 0 expired (older than the TTL); of 1..4 two fit: the most recently used, 1 and 4.
    assert kept == [False, True, False, False, True]
    stats = disk.make_stats()
    assert (stats.num_expired, stats.num_evictions, stats.num_blocks) == (1, 2, 2)
    assert stats.bytes_used == 2 * file_bytes


def test_sweep_removes_temporaries_left_by_a_dead_writer(tmp_path):
    disk = DiskTier(str(tmp_path), 1 << 20, ttl_s=10 * 86400)
    block_hash, tokens, payload = block(1)
    disk.put(LAYOUT, block_hash, tokens, payload)
    stale = disk.path(LAYOUT, block_hash) + ".tmp-1234-5"
    fresh = disk.path(LAYOUT, block_hash) + ".tmp-1234-6"
    for path, age in ((stale, 7200), (fresh, 10)):
        with open(path, "wb") as f:
            f.write(b"half a block")
        os.utime(path, (1e6 - age, 1e6 - age))
    os.utime(disk.path(LAYOUT, block_hash), (1e6, 1e6))
    disk.sweep(1e6)
    assert not os.path.exists(stale) and os.path.exists(fresh)
    assert os.path.exists(disk.path(LAYOUT, block_hash))


def test_host_tier_evicts_least_recently_used_past_its_budget():
    blocks = [block(i) for i in range(3)]
    host = HostTier(capacity_bytes=2 * blocks[0][2].nbytes)
    host.put(*blocks[0])
    host.put(*blocks[1])
    assert host.get(blocks[0][0], blocks[0][1]) is not None  # 0 is now the most recent
    host.put(*blocks[2])
    assert [b[0] in host for b in blocks] == [True, False, True]
    stats = host.make_stats()
    assert (stats.num_evictions, stats.num_blocks, stats.num_hits) == (1, 2, 1)


def test_an_unwritable_directory_disables_writes_once_and_reads_go_on(tmp_path, caplog):
    disk = DiskTier(str(tmp_path), 1 << 20, ttl_s=3600, key=KEY)
    first = block(1)
    disk.put(LAYOUT, *first)
    os.chmod(tmp_path, 0o555)
    for sub in tmp_path.rglob("*"):
        if sub.is_dir():
            os.chmod(sub, 0o555)
    try:
        probe = tmp_path / "probe"
        try:
            probe.write_bytes(b"")
            probe.unlink()
            pytest.skip("this user writes read-only directories (root); see the full-disk test")
        except OSError:
            pass
        disk.put(LAYOUT, *block(2))
        disk.put(LAYOUT, *block(3))
        assert disk.make_stats().writes_disabled
        assert sum("writes are off" in r.message for r in caplog.records) == 1
        assert disk.get(LAYOUT, first[0], first[1]) is not None
    finally:
        for sub in [tmp_path, *tmp_path.rglob("*")]:
            if sub.is_dir():
                os.chmod(sub, 0o755)


def test_a_bfloat16_block_round_trips_bit_for_bit():
    """The CUDA path's dtype: the bytes are stored as they are, whatever the dtype."""
    layout = dataclasses.replace(LAYOUT, dtype="bfloat16")
    block_hash, tokens, payload = block(3)
    payload = (payload / 7).to(torch.bfloat16)
    raw = encode_block(KEY, layout, block_hash, tokens, payload)
    _, got = decode_block(KEY, layout, block_hash, raw)
    assert got.dtype == torch.bfloat16 and torch.equal(
        got.view(torch.int16), payload.view(torch.int16)
    )
