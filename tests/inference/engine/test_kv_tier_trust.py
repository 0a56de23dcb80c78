"""The KV disk tier trusts no file (kv/tiers): a special file, a link out of the directory or a
read that never comes back does not hold up the engine, and a crafted block (a valid crc32, a
NaN payload, another model's header) is rejected, counted, removed and recomputed. Outputs are
an uncached engine's greedy ids."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import stat
import struct
import threading
import zlib
from pathlib import Path

import pytest
import torch

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.kv.hashing import extra_keys, hash_request_blocks
from inference.engine.kv.tiers import block_file
from inference.engine.kv.tiers.disk_tier import DiskTier
from tests.inference.engine.helpers import smollm2_tokens

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
KEY = "tests: the deployment's shared kv key"
TINY = dict(
    model="smollm2-tiny-random",
    num_kv_blocks=64,
    max_num_batched_tokens=64,
    kv_disk_cache_key=KEY,
    kv_disk_load_timeout_s=1.0,
)


@pytest.fixture(scope="module")
def reference():
    """Greedy outputs without tiers."""
    engine = LLMEngine(EngineConfig(model="smollm2-tiny-random", num_kv_blocks=64))
    yield lambda prompt: engine.generate([prompt], GREEDY)[0].token_ids
    engine.shutdown()


def make(directory: Path, **overrides) -> LLMEngine:
    return LLMEngine(EngineConfig(**{**TINY, "kv_disk_cache_dir": str(directory), **overrides}))


def written(directory: Path, seed: int) -> tuple[list[int], list[str]]:
    """A head of 160 tokens (and a tail) written to `directory` by one engine; returns another
    prompt with that head and the head's block files, in chain order."""
    rng = random.Random(seed)
    head = smollm2_tokens(rng, 160)
    first, second = head + smollm2_tokens(rng, 20), head + smollm2_tokens(rng, 27)
    writer = make(directory)
    try:
        writer.generate([first], GREEDY)
        assert writer.flush_kv_tiers()
        extra = extra_keys(writer.kv_cache_manager.hasher.model_fingerprint, None)
        hashes = hash_request_blocks(first, writer.config.block_size, extra, [])
        offloader = writer.offloader
        paths = [offloader.disk.path(offloader.layout, h) for h in hashes]
    finally:
        writer.shutdown()
    assert all(os.path.isfile(p) for p in paths)
    return second, paths


def _is_regular_file(path: str) -> bool:
    return stat.S_ISREG(os.lstat(path).st_mode)


# ---- item 1: special files, links, reads that do not come back --------------------------------


@pytest.mark.parametrize("kind", ["fifo", "symlinked file", "symlinked directory"])
def test_a_special_file_or_a_link_out_of_the_directory_is_refused_and_recomputed(
    tmp_path, reference, kind
):
    directory = tmp_path / "kv"
    second, paths = written(directory, 3)
    victim = paths[4]
    outside = tmp_path / "outside"
    outside.mkdir()
    first_bad = 4
    if kind == "fifo":
        os.unlink(victim)
        os.mkfifo(victim)
    elif kind == "symlinked file":  # a valid block, but outside the directory
        target = outside / "block.kvb"
        shutil.move(victim, target)
        os.symlink(target, victim)
    else:  # the block's bucket directory is a link to another place
        bucket = os.path.dirname(victim)
        first_bad = min(i for i, p in enumerate(paths) if os.path.dirname(p) == bucket)
        target = outside / "bucket"
        shutil.move(bucket, target)
        os.symlink(target, bucket)
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}

    reader = make(directory)
    try:
        out = reader.generate([second], GREEDY, timeout=30)[0]
        assert out.token_ids == reference(second)
        assert out.metrics.num_cached_tokens_disk == first_bad * 16
        assert reader.stats().kv_tiers["disk"].num_invalid == 1
        assert reader.flush_kv_tiers()
    finally:
        reader.shutdown()
    # Recomputed and written again as a regular file inside the directory; nothing outside
    # the directory was read into the cache, written or removed.
    assert _is_regular_file(victim)
    assert not os.path.islink(os.path.dirname(victim))
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == before


def test_a_read_that_does_not_come_back_holds_up_only_its_own_request(
    tmp_path, reference, monkeypatch
):
    """A stuck read (as on a hung network mount): the real reader behind a stall on one block.
    A request with no disk hit is served meanwhile, and the stuck request recomputes once its
    load has made no progress for kv_disk_load_timeout_s."""
    second, paths = written(tmp_path, 5)
    stuck_hash = bytes.fromhex(Path(paths[2]).stem)
    entered, release = threading.Event(), threading.Event()
    real_get = DiskTier.get

    def stalling_get(self, layout, block_hash, token_ids):
        if block_hash == stuck_hash:
            entered.set()
            release.wait(120)
        return real_get(self, layout, block_hash, token_ids)

    monkeypatch.setattr(DiskTier, "get", stalling_get)
    reader = make(tmp_path)
    results = {}
    victim = threading.Thread(
        target=lambda: results.setdefault("victim", reader.generate([second], GREEDY, timeout=60))
    )
    try:
        victim.start()
        assert entered.wait(30)
        cold = smollm2_tokens(random.Random(6), 100)
        out = reader.generate([cold], GREEDY, timeout=30)[0]
        assert out.token_ids == reference(cold) and out.metrics.num_cached_tokens_disk == 0
        victim.join(30)
        assert not release.is_set() and "victim" in results  # back while the read is stuck
        (out,) = results["victim"]
        assert out.token_ids == reference(second) and out.metrics.num_cached_tokens_disk == 0
        assert reader.stats().kv_tiers["disk"].num_read_failures == 1
    finally:
        release.set()
        victim.join(60)
        reader.shutdown()


def test_a_tier_whose_reads_keep_hanging_is_turned_off_with_one_warning(
    tmp_path, reference, monkeypatch, caplog
):
    release = threading.Event()
    real_get = DiskTier.get

    def hung_get(self, layout, block_hash, token_ids):  # the whole mount hangs
        release.wait(120)
        return real_get(self, layout, block_hash, token_ids)

    monkeypatch.setattr(DiskTier, "get", hung_get)
    reader = make(tmp_path, kv_disk_load_timeout_s=0.3)
    rng = random.Random(7)
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(5):
                prompt = smollm2_tokens(rng, 60)
                out = reader.generate([prompt], GREEDY, timeout=30)[0]
                assert out.token_ids == reference(prompt)
        stats = reader.stats().kv_tiers["disk"]
        assert stats.reads_disabled and stats.writes_disabled
        assert stats.num_read_failures == 3  # then no more loads were started
        assert out.metrics.kv_load_s == 0.0
        assert sum("disk tier is off" in r.getMessage() for r in caplog.records) == 1
    finally:
        release.set()
        reader.shutdown()


# ---- item 2: crafted blocks ---------------------------------------------------------------------


def _parts(raw: bytes, num_payload_bytes: int) -> tuple[dict, bytes]:
    """A block file's header and payload (the framing before them is the same in every
    version: magic, version, header length)."""
    _, _, header_len = struct.unpack_from("<4sII", raw)
    end = 12 + header_len
    return json.loads(raw[12:end]), raw[end : end + num_payload_bytes]


def _crc_sealed_v1(header: dict, payload: bytes) -> bytes:
    """The format before keyed MACs: anyone could write a valid one."""
    encoded = json.dumps(header).encode()
    body = struct.pack("<4sII", b"PKKV", 1, len(encoded)) + encoded + payload
    return body + struct.pack("<I", zlib.crc32(body))


def _scaled(payload: bytes, factor: float) -> bytes:
    return (torch.frombuffer(bytearray(payload), dtype=torch.float32) * factor).numpy().tobytes()


@pytest.mark.parametrize(
    "craft", ["times -3, valid crc32", "times -3, another key", "NaN, this key", "another model"]
)
def test_a_crafted_block_is_rejected_counted_removed_and_recomputed(tmp_path, reference, craft):
    second, paths = written(tmp_path, 9)
    victim = paths[4]
    probe = make(tmp_path)  # this deployment's layout for the files
    layout = probe.offloader.layout
    probe.shutdown()
    with open(victim, "rb") as f:
        header, payload = _parts(f.read(), layout.num_bytes)
    tokens = tuple(header["token_ids"])
    block_hash = bytes.fromhex(header["block_hash"])
    if craft == "times -3, valid crc32":
        crafted = _crc_sealed_v1(header, _scaled(payload, -3.0))
    else:
        tensor = torch.frombuffer(bytearray(payload), dtype=torch.float32).view(layout.shape)
        key, sealed_layout = KEY.encode(), layout
        if craft == "times -3, another key":
            tensor, key = tensor * -3, b"an attacker's guess at the key"
        elif craft == "NaN, this key":
            tensor = torch.full_like(tensor, float("nan"))
        else:
            sealed_layout = block_file.BlockLayout(
                "another-model", layout.group, layout.block_size, layout.shape, layout.dtype
            )
        crafted = block_file.encode_block(key, sealed_layout, block_hash, tokens, tensor)
    with open(victim, "wb") as f:
        f.write(crafted)

    reader = make(tmp_path)
    try:
        out = reader.generate([second], GREEDY, timeout=30)[0]
        assert out.token_ids == reference(second)
        assert out.metrics.num_cached_tokens_disk == 4 * 16
        assert reader.stats().kv_tiers["disk"].num_invalid == 1
        # Later requests with that head are not poisoned either.
        again = reader.generate([second], GREEDY, timeout=30)[0]
        assert again.token_ids == reference(second)
        assert reader.flush_kv_tiers()
    finally:
        reader.shutdown()
    with open(victim, "rb") as f:  # recomputed and written again, authentic
        _, good = block_file.decode_block(KEY.encode(), layout, block_hash, f.read())
    assert torch.isfinite(good).all()
