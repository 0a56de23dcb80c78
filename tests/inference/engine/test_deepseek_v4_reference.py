"""DeepSeek-V4 (deepseek-v4-tiny-random) against transformers' DeepseekV4ForCausalLM built from
the same config.json and safetensors, fp32 on CPU: logits on prompts shorter than a window and
across CSA (4) and HCA (128) window edges, through chunked prefill and decode; greedy output
identical; prefix-cache hits that end inside and at the edge of windows resume exactly."""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.models import load_model
from inference.engine.models.deepseek_v4.tiny import NAME, tiny_checkpoint
from tests.inference.engine.helpers import smollm2_tokens as random_tokens
from tests.inference.engine.helpers import v4_one_pass

BLOCK = 16


@pytest.fixture(scope="module")
def reference():
    transformers = pytest.importorskip("transformers")
    path = tiny_checkpoint(0)
    config = transformers.DeepseekV4Config(**json.loads((path / "config.json").read_text()))
    config._attn_implementation = "eager"
    model = transformers.DeepseekV4ForCausalLM(config).eval()
    weights = load_file(str(path / "model.safetensors"))
    # transformers does not build the MTP layer (`mtp.0.*`): ours only (deepseek_v4.mtp).
    main = {name: tensor for name, tensor in weights.items() if not name.startswith("mtp.")}
    model.load_state_dict(main, strict=True)
    return model


@pytest.fixture(scope="module")
def ours():
    return load_model(NAME, torch.device("cpu")).model


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).abs().max() / reference.abs().max())


def one_pass(model, ids: list[int], rows: list[int]) -> torch.Tensor:
    """The model over `ids` in one step, on fresh state of its own."""
    return v4_one_pass(model, ids, rows, BLOCK)[0]


@pytest.mark.parametrize("length", [37, 131, 300, 700])
def test_logits_match_transformers(ours, reference, length):
    """Rows on both sides of CSA and HCA window edges (3/4, 127/128/129, 255/256, 511/512)."""
    ids = random_tokens(random.Random(length), length)
    edges = [0, 3, 4, 5, 127, 128, 129, 255, 256, 511, 512, length - 1]
    rows = sorted({r for r in edges if r < length})
    with torch.inference_mode():
        theirs = reference(torch.tensor([ids])).logits[0, rows]
    for row, o, r in zip(rows, one_pass(ours, ids, rows), theirs, strict=True):
        assert relative_error(o, r) < 1e-4, f"position {row}"


@pytest.fixture(scope="module")
def chunked_engine():
    # 100-token steps: chunks end inside CSA and HCA windows and cross the sliding window.
    engine = LLMEngine(
        EngineConfig(
            model=NAME, num_kv_blocks=128, max_num_batched_tokens=100, enable_prefix_caching=False
        )
    )
    yield engine
    engine.shutdown()


def captured_logits(engine: LLMEngine, prompt, params: SamplingParams):
    """The engine's output and the logits of every step that sampled a token."""
    captured: list[torch.Tensor] = []

    def keep(module, inputs, logits):
        if logits.shape[0]:
            captured.append(logits[0].clone())

    hook = engine.runner.model.register_forward_hook(keep)
    try:
        output = engine.generate(prompt, params)[0]
    finally:
        hook.remove()
    return output, captured


@pytest.mark.parametrize("length", [90, 300])
def test_chunked_prefill_and_decode_match_transformers(chunked_engine, reference, length):
    """32 greedy tokens through the engine (prefill in 100-token chunks, then decode across
    the 128 and 256 edges for the longer prompt): the same tokens, logits within 1e-4."""
    ids = random_tokens(random.Random(1000 + length), length)
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    output, captured = captured_logits(chunked_engine, ids, params)
    with torch.inference_mode():
        theirs = reference.generate(
            torch.tensor([ids]),
            max_new_tokens=32,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    assert output.token_ids == theirs.sequences[0, length:].tolist()
    assert len(captured) == 32
    for step, (o, r) in enumerate(zip(captured, theirs.logits, strict=True)):
        assert relative_error(o, r[0]) < 1e-4, f"step {step}"


@pytest.fixture(scope="module")
def caching_engine():
    engine = LLMEngine(EngineConfig(model=NAME, num_kv_blocks=256, max_num_batched_tokens=128))
    yield engine
    engine.shutdown()


# Hits that end inside a CSA window (P mod 4 != 0), at CSA edges inside an HCA window, at the
# HCA edge (256) and just past it, and beyond one sliding window.
@pytest.mark.parametrize("shared", [130, 132, 250, 256, 258, 383])
def test_prefix_hits_resume_exactly(caching_engine, chunked_engine, shared):
    rng = random.Random(shared)
    head = random_tokens(rng, shared)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    caching_engine.generate(head + random_tokens(rng, 20), params)
    prompt = head + random_tokens(rng, 20)
    hit, hit_logits = captured_logits(caching_engine, prompt, params)
    cold, cold_logits = captured_logits(chunked_engine, prompt, params)
    assert hit.metrics.num_cached_tokens == shared  # token-exact, wherever it ends
    assert hit.token_ids == cold.token_ids
    for step, (h, c) in enumerate(zip(hit_logits, cold_logits, strict=True)):
        assert relative_error(h, c) < 1e-4, f"step {step}"


@pytest.mark.parametrize("interval", [None, 0, 256])
def test_every_reuse_source_gives_transformers_tokens(reference, interval):
    """At each retention interval, a scenario that reuses from the cached block chain (dense:
    partial blocks copied at 200 and 230), a junction (where a prompt left a cached one) and a
    breakpoint: every request's greedy tokens are transformers'."""
    engine = LLMEngine(
        EngineConfig(
            model=NAME, num_kv_blocks=256, max_num_batched_tokens=128, retention_interval=interval
        )
    )
    rng = random.Random(500 + (interval or 1))
    head = random_tokens(rng, 300)
    steps = [
        (head + random_tokens(rng, 12), None),  # cold
        (head[:200] + random_tokens(rng, 12), None),  # leaves the first inside its cached range
        (head[:200] + random_tokens(rng, 12), None),  # resumes at that junction
        (head[:230] + random_tokens(rng, 12), [230]),  # declares a breakpoint at 230
        (head[:230] + random_tokens(rng, 12), None),  # resumes there
    ]
    sources = []
    try:
        for prompt, breakpoints in steps:
            params = SamplingParams(
                max_tokens=8, temperature=0.0, ignore_eos=True, cache_breakpoints=breakpoints
            )
            output = engine.generate(prompt, params)[0]
            sources.append(output.metrics.reuse_source)
            with torch.inference_mode():
                theirs = reference.generate(
                    torch.tensor([prompt]), max_new_tokens=8, do_sample=False
                )
            assert output.token_ids == theirs[0, len(prompt) :].tolist(), sources
    finally:
        engine.shutdown()
    if interval is None:  # dense keeps every block: the chain (partial blocks copied) serves all
        assert sources == ["none"] + ["block_chain"] * 4, sources
    else:
        assert sources[2] == "junction" and sources[4] == "breakpoint", sources
