"""KV tiers in the engine (kv/tiers): a head that left the device pool comes back from host
memory or disk, in this process or another, with the same greedy output as without tiers;
damaged files are detected and recomputed; an unwritable directory keeps the engine serving."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.core.engine_builder import _kv_tiers_unsupported
from inference.engine.kv.hashing import extra_keys, hash_request_blocks
from inference.engine.kv.tiers.block_file import FORMAT_VERSION, decode_block, encode_block
from inference.engine.models.deepseek_v4.config import DeepseekV4Config
from inference.engine.models.deepseek_v4.state import DeepseekV4State
from inference.engine.models.deepseek_v4.state_spec import DeepseekV4StateSpec
from inference.engine.models.deepseek_v4.tiny import TINY_CONFIG
from inference.engine.request import Request
from tests.inference.engine.helpers import (
    ROUNDING,
    random_tokens,
    smollm2_tokens,
    tiny_kv_cache_manager,
    tiny_scheduler,
)

ROOT = Path(__file__).resolve().parents[3]
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
# Engines that share a directory share its key (an engine without one trusts its own files only).
KEY = "tests: the deployment's shared kv key"
TINY = dict(
    model="smollm2-tiny-random",
    num_kv_blocks=64,
    max_num_batched_tokens=64,
    kv_disk_cache_key=KEY,
)


def prompts(seed: int, head: int = 160, tail: int = 20) -> tuple[list[int], list[int], list[int]]:
    """A head and two prompts that start with it."""
    rng = random.Random(seed)
    shared = smollm2_tokens(rng, head)
    return shared, shared + smollm2_tokens(rng, tail), shared + smollm2_tokens(rng, tail + 7)


@pytest.fixture(scope="module")
def reference():
    """Greedy outputs without tiers."""
    engine = LLMEngine(EngineConfig(**TINY))
    yield lambda prompt: engine.generate([prompt], GREEDY)[0].token_ids
    engine.shutdown()


def make(tmp_path=None, **overrides) -> LLMEngine:
    config = dict(TINY)
    if tmp_path is not None:
        config["kv_disk_cache_dir"] = str(tmp_path)
    config.update(overrides)
    return LLMEngine(EngineConfig(**config))


def head_paths(engine: LLMEngine, tokens: list[int]) -> list[str]:
    """The disk tier's file of each full block of `tokens`, in chain order."""
    offloader = engine.offloader
    extra = extra_keys(engine.kv_cache_manager.hasher.model_fingerprint, None)
    hashes = hash_request_blocks(tokens, engine.config.block_size, extra, [])
    return [offloader.disk.path(offloader.layout, h) for h in hashes]


def test_a_head_from_the_device_pool_host_memory_and_disk_gives_the_same_greedy_output(
    tmp_path, reference
):
    _, first, second = prompts(1)
    engine = make(tmp_path, kv_host_cache_bytes=16 << 20)
    try:
        engine.generate([first], GREEDY)
        from_pool = engine.generate([second], GREEDY)[0]
        assert from_pool.metrics.num_cached_tokens == 160
        assert (
            from_pool.metrics.num_cached_tokens_host
            == 0
            == from_pool.metrics.num_cached_tokens_disk
        )
        assert from_pool.token_ids == reference(second)
        # Unrelated prompts push the head out of the 64-block pool; host memory still has it.
        for seed in range(2, 6):
            engine.generate([prompts(seed, head=400)[1]], GREEDY)
        assert engine.flush_kv_tiers()
        from_host = engine.generate([second], GREEDY)[0]
        # The whole of `second` computed above (11 full blocks), not just the shared head.
        assert from_host.metrics.num_cached_tokens_host == 176
        assert from_host.metrics.num_cached_tokens == 176 and from_host.metrics.kv_load_s > 0
        assert from_host.token_ids == reference(second)
        assert engine.stats().kv_tiers["host"].num_hits == 11
    finally:
        engine.shutdown()
    # A fresh engine (empty pool, no host tier) on the same directory: the head is on disk.
    fresh = make(tmp_path)
    try:
        from_disk = fresh.generate([second], GREEDY)[0]
        assert from_disk.metrics.num_cached_tokens_disk == 176
        assert from_disk.token_ids == reference(second)
        stats = fresh.stats().kv_tiers["disk"]
        assert stats.num_hits == 11 and stats.num_invalid == 0 and stats.bytes_read > 0
    finally:
        fresh.shutdown()


def test_without_tiers_nothing_is_loaded_and_a_cold_prompt_loads_nothing(tmp_path, reference):
    _, first, _ = prompts(7)
    engine = make(tmp_path)
    try:
        out = engine.generate([first], GREEDY)[0]
        assert out.metrics.num_cached_tokens == 0 and out.token_ids == reference(first)
        assert engine.stats().kv_tiers["disk"].num_misses == 1
        assert "host" not in engine.stats().kv_tiers
    finally:
        engine.shutdown()
    plain = make()
    assert plain.offloader is None and plain.stats().kv_tiers == {}
    plain.shutdown()


WRITER = (
    f"KEY = {KEY!r}\n"
    + """
import sys
from inference.engine import EngineConfig, LLMEngine, SamplingParams
config = dict(model="smollm2-tiny-random", num_kv_blocks=64, max_num_batched_tokens=64)
engine = LLMEngine(EngineConfig(**config, kv_disk_cache_dir=sys.argv[1], kv_disk_cache_key=KEY))
tokens = [int(t) for t in sys.argv[2].split(",")]
engine.generate([tokens], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
assert engine.flush_kv_tiers()
engine.shutdown()
"""
)


def test_a_new_process_reuses_a_head_two_other_processes_wrote_at_once(tmp_path, reference):
    _, first, second = prompts(11, head=320)
    argv = [sys.executable, "-c", WRITER, str(tmp_path), ",".join(map(str, first))]
    writers = [subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE) for _ in range(2)]
    for writer in writers:
        _, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err.decode()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files and all(p.suffix == ".kvb" for p in files)  # no temporaries left behind
    reader = make(tmp_path)
    try:
        out = reader.generate([second], GREEDY)[0]
        assert out.metrics.num_cached_tokens_disk == 320
        assert out.token_ids == reference(second)
        assert reader.stats().kv_tiers["disk"].num_invalid == 0
    finally:
        reader.shutdown()


def _truncate(path: str) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _flip_a_byte(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 100)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x55]))


def _bump_version(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(struct.pack("<I", FORMAT_VERSION + 1))


@pytest.mark.parametrize("damage", ["truncated", "corrupt", "foreign model", "wrong version"])
def test_a_damaged_file_is_detected_deleted_and_recomputed(tmp_path, reference, damage):
    _, first, second = prompts(21)
    writer = make(tmp_path)
    writer.generate([first], GREEDY)
    assert writer.flush_kv_tiers()
    paths = head_paths(writer, first)
    layout = writer.offloader.layout
    writer.shutdown()
    damaged = paths[4]  # blocks 0-3 still load; 4 is refused, 5.. are past the break
    if damage == "truncated":
        _truncate(damaged)
    elif damage == "corrupt":
        _flip_a_byte(damaged)
    elif damage == "wrong version":
        _bump_version(damaged)
    else:  # a valid file of another model, under this block's name
        block_hash = bytes.fromhex(Path(damaged).stem)
        with open(damaged, "rb") as f:
            tokens, payload = decode_block(KEY.encode(), layout, block_hash, f.read())
        foreign = dataclasses.replace(layout, model_fingerprint="another-model")
        with open(damaged, "wb") as f:
            f.write(encode_block(KEY.encode(), foreign, block_hash, tokens, payload))
    reader = make(tmp_path)
    try:
        out = reader.generate([second], GREEDY)[0]
        assert out.metrics.num_cached_tokens_disk == 4 * 16
        assert out.token_ids == reference(second)
        assert reader.stats().kv_tiers["disk"].num_invalid == 1
        assert reader.flush_kv_tiers()
        assert os.path.exists(damaged)  # recomputed and written again, valid
        with open(damaged, "rb") as f:
            raw = f.read()
        decode_block(KEY.encode(), reader.offloader.layout, bytes.fromhex(Path(damaged).stem), raw)
    finally:
        reader.shutdown()


FULL_DISK = (
    f"KEY = {KEY!r}\n"
    + """
import logging, resource, signal, sys, json
from inference.engine import EngineConfig, LLMEngine, SamplingParams
logging.basicConfig(level=logging.WARNING)
config = dict(model="smollm2-tiny-random", num_kv_blocks=64, max_num_batched_tokens=64)
engine = LLMEngine(EngineConfig(**config, kv_disk_cache_dir=sys.argv[1], kv_disk_cache_key=KEY))
# From here on no file may grow past 1 KiB (a block file is ~8 KiB): the disk is "full".
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
outputs = [engine.generate([[int(t) for t in p.split(",")]], params)[0] for p in sys.argv[2:]]
assert engine.flush_kv_tiers()
stats = engine.stats().kv_tiers["disk"]
print(json.dumps({"tokens": [o.token_ids for o in outputs], "disabled": stats.writes_disabled,
                  "written": stats.bytes_written}))
engine.shutdown()
"""
)


def test_a_full_disk_disables_writes_with_one_warning_and_the_engine_serves_on(tmp_path, reference):
    _, first, second = prompts(31)
    argv = [sys.executable, "-c", FULL_DISK, str(tmp_path)]
    argv += [",".join(map(str, p)) for p in (first, second)]
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode()
    result = json.loads(run.stdout.decode().strip().splitlines()[-1])
    assert result["disabled"] and result["written"] == 0
    assert result["tokens"] == [reference(first), reference(second)]
    assert run.stderr.decode().count("writes are off") == 1
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # no half-written file left


def test_the_scheduler_skips_a_request_whose_blocks_are_loading():
    manager = tiny_kv_cache_manager(16, 4)
    scheduler = tiny_scheduler(manager, max_num_seqs=4, max_num_batched_tokens=16)
    loading = Request("loading", list(range(8)), SamplingParams(max_tokens=2))
    loading.kv_load_state = "loading"
    ready = Request("ready", list(range(100, 106)), SamplingParams(max_tokens=2))
    scheduler.add_request(loading)
    scheduler.add_request(ready)
    output = scheduler.schedule()
    assert [s.request.request_id for s in output.scheduled] == ["ready"]
    loading.kv_load_state = "done"
    output = scheduler.schedule()
    assert [s.request.request_id for s in output.scheduled] == ["ready", "loading"]


@pytest.mark.parametrize("interval", [None, 256])
def test_gemma3_resumes_from_disk_where_the_device_pool_would(tmp_path, interval):
    """The sliding group's window blocks and checkpoint records go to disk too: a fresh engine
    resumes at the checkpoint the device pool would have used (block-rounded reuse, the same
    retention interval) with the same greedy output."""
    rng = random.Random(51)
    head = random_tokens(rng, 700)  # longer than the 512-token window
    first, second = head + random_tokens(rng, 30), head + random_tokens(rng, 25)
    config = dict(
        model="gemma3-tiny-random",
        num_kv_blocks=200,
        max_num_batched_tokens=256,
        retention_interval=interval,
        kv_disk_cache_key=KEY,
        **ROUNDING,
    )
    pool_only = LLMEngine(EngineConfig(**config))
    try:
        pool_only.generate([first], GREEDY)
        from_pool = pool_only.generate([second], GREEDY)[0]
    finally:
        pool_only.shutdown()
    assert from_pool.metrics.num_cached_tokens == (688 if interval is None else 512)
    writer = LLMEngine(EngineConfig(**config, kv_disk_cache_dir=str(tmp_path)))
    writer.generate([first], GREEDY)
    assert writer.flush_kv_tiers()
    writer.shutdown()
    reader = LLMEngine(EngineConfig(**config, kv_disk_cache_dir=str(tmp_path)))
    try:
        from_disk = reader.generate([second], GREEDY)[0]
    finally:
        reader.shutdown()
    assert from_disk.metrics.num_cached_tokens == from_pool.metrics.num_cached_tokens
    assert from_disk.metrics.num_cached_tokens_disk == from_pool.metrics.num_cached_tokens
    assert from_disk.token_ids == from_pool.token_ids


V4 = dict(
    model="deepseek-v4-tiny-random",
    num_kv_blocks=30,  # one 310-token prompt holds 20
    max_num_batched_tokens=128,
    kv_disk_cache_key=KEY,
    **ROUNDING,
)


def v4_prompt_state(engine: LLMEngine, tokens: list[int]) -> dict[str, torch.Tensor]:
    """The rows of DeepSeek-V4's state that `tokens`' full blocks hold in the engine (cached
    blocks, found by chain hash): every CSA entry and indexer key, the HCA entries (in the
    blocks that close a 128-token window), and the window rows of the last 8 blocks."""
    manager, size = engine.kv_cache_manager, engine.config.block_size
    extra = extra_keys(manager.hasher.model_fingerprint, None)
    hashes = hash_request_blocks(tokens, size, extra, [])
    full = [manager.block_pool.get_block_by_hash(h).block_id for h in hashes]
    window = [manager.sliding.block_pool.get_block_by_hash(h).block_id for h in hashes[-8:]]
    slots = [b * size + i for b in window for i in range(size)]
    entries = [b * (size // 4) + i for b in full for i in range(size // 4)]
    state = engine.runner.state
    return {
        "window K=V": state.window[:, slots],
        "CSA inputs": state.csa_projections[:, slots],
        "HCA inputs": state.hca_projections[:, slots],
        "CSA entries": state.csa_entries[:, entries],
        "indexer keys": state.csa_index_entries[:, entries],
        "HCA entries": state.hca_entries[:, full[128 // size - 1 :: 128 // size]],
    }


def assert_same_state(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    for name, rows in expected.items():
        # Computed in other chunks than the reference's: equal up to float rounding.
        torch.testing.assert_close(found[name], rows, rtol=1e-4, atol=1e-5, msg=name)


def test_deepseek_v4_resumes_from_host_memory_and_disk_as_a_cold_engine_answers(tmp_path):
    """A 300-token head (past the 128-token window and the first HCA window): the tiers hold
    its compressed entries (full group) and its window checkpoints (sliding group: K=V and
    compressor inputs, HCA's buffer among them). Resumed from host memory, then from disk in a
    fresh engine, a prompt answers as an engine that computes it all, and holds the same
    state. (The state is compared too: the tiny model's greedy tokens survive losing HCA's
    entries or inputs.)"""
    rng = random.Random(71)
    head = smollm2_tokens(rng, 300)
    first, second = head + smollm2_tokens(rng, 10), head + smollm2_tokens(rng, 12)
    cold = LLMEngine(EngineConfig(**V4))  # an empty pool: computes all of `second`
    try:
        expected = cold.generate([second], GREEDY)[0].token_ids
        expected_state = {k: v.clone() for k, v in v4_prompt_state(cold, second).items()}
    finally:
        cold.shutdown()
    assert expected_state["HCA entries"].abs().amax(dim=-1).gt(0).all()  # RMS-normed: never 0
    engine = LLMEngine(
        EngineConfig(**V4, kv_disk_cache_dir=str(tmp_path), kv_host_cache_bytes=16 << 20)
    )
    try:
        engine.generate([first], GREEDY)
        # Two other prompts push the head's blocks out of the 30-block pool.
        engine.generate([smollm2_tokens(rng, 300)], GREEDY)
        engine.generate([smollm2_tokens(rng, 300)], GREEDY)
        assert engine.flush_kv_tiers()
        from_host = engine.generate([second], GREEDY)[0]
        assert_same_state(v4_prompt_state(engine, second), expected_state)
    finally:
        engine.shutdown()
    # The window checkpoint at 288: HCA's buffer holds 32 tokens, CSA's overlap is live.
    assert from_host.metrics.num_cached_tokens == 288
    assert from_host.metrics.num_cached_tokens_host == 288
    assert from_host.token_ids == expected
    reader = LLMEngine(EngineConfig(**V4, kv_disk_cache_dir=str(tmp_path)))
    try:
        from_disk = reader.generate([second], GREEDY)[0]
        stats = reader.stats().kv_tiers["disk"]
        assert_same_state(v4_prompt_state(reader, second), expected_state)
    finally:
        reader.shutdown()
    # The whole of `second` computed above: its 19 full-group blocks and the window blocks
    # (8, 128 tokens) of its checkpoint at 304, where HCA's buffer holds 48 tokens.
    assert from_disk.metrics.num_cached_tokens_disk == 304 == from_disk.metrics.num_cached_tokens
    assert stats.num_hits == 19 + 8 and stats.num_invalid == 0
    assert from_disk.token_ids == expected


def test_deepseek_v4_blocks_read_and_written_elsewhere_hold_the_same_state():
    """read_blocks → write_blocks to other block ids reproduces every row the blocks own (the
    tiers' round trip, with the payload cut per block and joined again as the offloader does),
    and touches no other block."""
    config = DeepseekV4Config.from_hf_config({**TINY_CONFIG, "vocab_size": 512})
    state = DeepseekV4State(config, 8, 8, 16, torch.float32, torch.device("cpu"))
    rows_per_block = {  # each tensor, and the rows one block owns in it
        "window": (state.window, 16),
        "csa_projections": (state.csa_projections, 16),
        "hca_projections": (state.hca_projections, 16),
        "csa_entries": (state.csa_entries, 4),
        "csa_index_entries": (state.csa_index_entries, 4),
        "hca_entries": (state.hca_entries, 1),
    }
    generator = torch.Generator().manual_seed(0)
    for tensor, _ in rows_per_block.values():
        tensor.copy_(torch.randn(tensor.shape, generator=generator))
    before = {name: tensor.clone() for name, (tensor, _) in rows_per_block.items()}
    src, dst = [3, 1], [5, 0]
    for group in ("full", "sliding"):
        payload = state.read_blocks(group, src)
        assert payload.device.type == "cpu"
        blocks = [payload[:, i * 16 : (i + 1) * 16] for i in range(len(src))]
        assert all(tuple(b.shape) == state.block_shape(group) for b in blocks)
        state.write_blocks(group, dst, torch.cat(blocks, dim=1))
    for name, (tensor, rows) in rows_per_block.items():
        expected = before[name].clone()
        for s, d in zip(src, dst, strict=True):
            expected[:, d * rows : (d + 1) * rows] = before[name][:, s * rows : (s + 1) * rows]
        assert torch.equal(tensor, expected), name
    with pytest.raises(ValueError, match="payload of shape"):
        state.write_blocks("full", [2], state.read_blocks("full", [1, 2]))


def test_only_a_tensor_parallel_engine_is_kept_from_the_tiers(tmp_path):
    """Every model's state goes through the tiers; a tensor-parallel engine's shards do not
    yet (refused when asked for, run without them where supported: engine_builder)."""
    config = EngineConfig(model="deepseek-v4-tiny-random", kv_disk_cache_dir=str(tmp_path))
    spec = DeepseekV4StateSpec(DeepseekV4Config.from_hf_config({**TINY_CONFIG, "vocab_size": 512}))
    assert _kv_tiers_unsupported(config, spec, is_parallel=False) is None
    assert "tensor_parallel_size=1" in _kv_tiers_unsupported(config, spec, is_parallel=True)


@pytest.mark.real_model
def test_smollm2_resumes_a_head_from_disk_with_the_same_greedy_output(tmp_path):
    _, first, second = prompts(41, head=96, tail=10)
    config = dict(
        model="smollm2-135m-instruct",
        num_kv_blocks=64,
        max_num_batched_tokens=128,
        kv_disk_cache_key=KEY,
    )
    plain = LLMEngine(EngineConfig(**config))
    try:
        expected = plain.generate([second], GREEDY)[0].token_ids
    finally:
        plain.shutdown()
    writer = LLMEngine(EngineConfig(**config, kv_disk_cache_dir=str(tmp_path)))
    writer.generate([first], GREEDY)
    assert writer.flush_kv_tiers()
    writer.shutdown()
    reader = LLMEngine(EngineConfig(**config, kv_disk_cache_dir=str(tmp_path)))
    try:
        out = reader.generate([second], GREEDY)[0]
        assert out.metrics.num_cached_tokens_disk == 96
        assert out.token_ids == expected
    finally:
        reader.shutdown()


def test_requests_arriving_together_with_one_head_read_it_from_disk_once(tmp_path, reference):
    rng = random.Random(61)
    head = smollm2_tokens(rng, 160)
    tick1 = [head + smollm2_tokens(rng, 40) for _ in range(3)]
    tick2 = [prompt + smollm2_tokens(rng, 5) for prompt in tick1]
    writer = make(tmp_path)
    writer.generate(tick1, GREEDY)
    assert writer.flush_kv_tiers()
    writer.shutdown()
    reader = make(tmp_path)
    try:
        outputs = reader.generate(tick2, GREEDY)
        stats = reader.stats().kv_tiers["disk"]
    finally:
        reader.shutdown()
    # Each prompt's 12 full blocks: the head's 10 read once, then each request's own 2.
    assert [o.metrics.num_cached_tokens for o in outputs] == [192, 192, 192]
    assert sum(o.metrics.num_cached_tokens_disk for o in outputs) == 160 + 3 * 32
    assert stats.num_hits == 10 + 3 * 2
    assert [o.token_ids for o in outputs] == [reference(p) for p in tick2]


def _num_threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.real_model
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_writing_blocks_starts_no_openmp_team_beside_the_engine_threads(tmp_path):
    """A thread that runs a multi-threaded torch op keeps an OpenMP team; beside the engine
    thread's, libgomp stops spinning and every decode step waits for its workers to wake (a
    4-sequence SmolLM2 step went from 34 to 50 ms when the writer cloned blocks itself)."""
    import torch

    if torch.get_num_threads() < 2:
        pytest.skip("one torch thread: no team to start")
    engine = LLMEngine(EngineConfig(model="smollm2-135m-instruct", kv_disk_cache_dir=str(tmp_path)))
    try:
        engine.generate([[1, 2, 3]], GREEDY)  # the engine thread's team; nothing to write
        before = _num_threads()
        rng = random.Random(4)
        engine.generate([smollm2_tokens(rng, 200)], GREEDY)
        assert engine.flush_kv_tiers()
        assert (
            engine.stats().kv_tiers["disk"].bytes_written >= 12 * 60 * 16 * 3 * 64 * 4
        )  # 12 blocks
        assert _num_threads() == before
    finally:
        engine.shutdown()
