"""A bfloat16 KV cache on the CPU (RunnerConfig.kv_cache_dtype): its attention against float32's,
its budget, the prefix cache and the disk tier over it, and the combinations refused."""

import random

import pytest
import torch

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.attention import decode_windows as decode_windows_module
from inference.engine.attention.attention import _flash_masked, reference_attention
from inference.engine.attention.decode_windows import decode_attention, plan_decode_batch, slot_runs

H, KVH, D, BLOCK = 6, 2, 8, 4
CPU = torch.device("cpu")
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("seed", range(4))
def test_decode_attention_over_a_bfloat16_cache_matches_float32_sdpa_of_its_values(
    monkeypatch, seed
):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    monkeypatch.setattr(decode_windows_module, "SPLITS", rng.choice([1, 3]))
    monkeypatch.setattr(decode_windows_module, "MIN_SPLIT_LEN", 1)
    k_cache = torch.randn(256, KVH, D).bfloat16()
    v_cache = torch.randn_like(k_cache)
    tables = [[0, 1, 2, *rng.sample(range(3, 64), 4)] for _ in range(3)]
    lengths = [len(t) * BLOCK - rng.randrange(BLOCK) for t in tables]
    runs = [slot_runs(t, n, BLOCK) for t, n in zip(tables, lengths, strict=True)]
    batch = plan_decode_batch([0, 1, 2], [0, 1, 2], runs, CPU)
    q = torch.randn(3, H, D)
    out = decode_attention(q.bfloat16(), k_cache, v_cache, batch, D**-0.5, _flash_masked)
    for i, (table, n) in enumerate(zip(tables, lengths, strict=True)):
        ctx = torch.tensor([table[p // BLOCK] * BLOCK + p % BLOCK for p in range(n)])
        expected = reference_attention(
            q[i][None], k_cache[ctx].float(), v_cache[ctx].float(), D**-0.5
        )
        # The query is rounded to bfloat16 too: about 3 significant digits.
        torch.testing.assert_close(out[i : i + 1].float(), expected, atol=3e-2, rtol=3e-2)


def _run(model: str, prompts, **config):
    """Outputs and the logits of every sampling step."""
    engine = LLMEngine(EngineConfig(model=model, num_kv_blocks=256, **config))
    logits_of_steps: list[torch.Tensor] = []
    sample = engine.runner.sample

    def recording_sample(logits, plan):
        if plan.sampling:
            logits_of_steps.append(logits.detach().float().clone())
        return sample(logits, plan)

    engine.runner.sample = recording_sample
    try:
        dtype = engine.runner.kv_caches[0][0].dtype
        first = engine.generate(prompts, GREEDY)
        again = engine.generate(prompts[:1], GREEDY)  # its head from the prefix cache
        return dtype, first + again, logits_of_steps
    finally:
        engine.shutdown()


@pytest.mark.parametrize("model", ["smollm2-tiny-random", "gemma3-tiny-random"])
def test_a_bfloat16_cache_gives_logits_close_to_float32s(model):
    rng = random.Random(5)
    head = [rng.randrange(1000, 30000) for _ in range(40)]
    prompts = [head + [rng.randrange(1000, 30000) for _ in range(rng.randint(3, 20))]]
    prompts += [[rng.randrange(1000, 30000) for _ in range(30)]]
    exact_dtype, exact, exact_logits = _run(model, prompts)
    half_dtype, half, half_logits = _run(model, prompts, kv_cache_dtype="bfloat16")
    assert (exact_dtype, half_dtype) == (torch.float32, torch.bfloat16)
    assert half[2].metrics.num_cached_tokens > 0  # the second run read the cached head
    # Greedy tokens may part where two logits are within bfloat16's rounding; compare the steps
    # both runs took alike (the same tokens so far).
    compared = 0
    for a, b in zip(exact_logits, half_logits, strict=True):
        if a.shape != b.shape:
            break
        scale = a.abs().max()
        assert (a - b).abs().max() <= 0.02 * scale, "logits drifted past bfloat16's rounding"
        compared += 1
    assert compared >= 3
    assert [o.token_ids[:2] for o in half] == [o.token_ids[:2] for o in exact]


def test_a_bfloat16_cache_holds_twice_the_blocks_of_the_same_budget():
    budget = dict(model="smollm2-tiny-random", kv_cache_memory_bytes=8 << 20)
    exact = LLMEngine(EngineConfig(**budget))
    half = LLMEngine(EngineConfig(**budget, kv_cache_dtype="bfloat16"))
    try:
        assert half.num_blocks == 2 * exact.num_blocks
    finally:
        exact.shutdown()
        half.shutdown()


def test_a_head_written_to_disk_in_bfloat16_is_read_back_by_a_bfloat16_engine_only(tmp_path):
    rng = random.Random(9)
    prompt = [rng.randrange(1000, 30000) for _ in range(70)]
    tiers = dict(
        model="smollm2-tiny-random",
        num_kv_blocks=256,
        kv_disk_cache_dir=str(tmp_path),
        kv_disk_cache_key=b"one key for the writer and readers",  # engines that share files
    )
    writer = LLMEngine(EngineConfig(**tiers, kv_cache_dtype="bfloat16"))
    try:
        (written,) = writer.generate([prompt], GREEDY)
        assert writer.flush_kv_tiers()
    finally:
        writer.shutdown()
    reader = LLMEngine(EngineConfig(**tiers, kv_cache_dtype="bfloat16"))
    try:
        (read,) = reader.generate([prompt], GREEDY)
    finally:
        reader.shutdown()
    assert read.metrics.num_cached_tokens_disk == 64
    assert read.token_ids == written.token_ids
    # A float32 engine keeps its blocks in a directory of its own layout: nothing to read.
    other = LLMEngine(EngineConfig(**tiers))
    try:
        (cold,) = other.generate([prompt], GREEDY)
    finally:
        other.shutdown()
    assert cold.metrics.num_cached_tokens_disk == 0


@pytest.mark.parametrize(
    "config, message",
    [
        (dict(kv_cache_dtype="float16"), "float16 attention is ~2x slower"),
        (dict(kv_cache_dtype="int8"), "kv_cache_dtype must be one of"),
        (dict(device="cuda", dtype="bfloat16", kv_cache_dtype="float32"), "on CUDA"),
    ],
)
def test_kv_cache_dtypes_that_cannot_run_are_refused(config, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model="smollm2-tiny-random", **config)


def test_deepseek_v4_keeps_its_own_state_in_its_dtype_and_says_so(caplog):
    """The deployment's bfloat16 default must not stop `make run` with DeepSeek-V4."""
    engine = LLMEngine(EngineConfig(model="deepseek-v4-tiny-random", kv_cache_dtype="bfloat16"))
    try:
        (out,) = engine.generate([[5, 6, 7, 8]], GREEDY)
    finally:
        engine.shutdown()
    assert out.metrics.kv_cache_dtype == "float32"  # what it ran with, not what was asked
    assert "kv_cache_dtype=bfloat16 does not apply" in caplog.text
