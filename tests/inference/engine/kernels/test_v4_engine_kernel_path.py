"""deepseek-v4-tiny-random through LLMEngine with attention_backend="triton" (V4's kernels,
interpreted) against "torch": the same greedy tokens for a ragged batch, one prompt past the
first HCA window (128 tokens) and the sliding window (128), one short, and a third that
shares the first's head and resumes from its cached prefix; and two prompts in a pool too small
for both, one preempted and recomputed."""

from __future__ import annotations

import random
import uuid
from collections import Counter

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.kernels import v4_compress, v4_indexer, v4_sparse_attention
from inference.engine.models.deepseek_v4.tiny import NAME
from tests.inference.engine.helpers import smollm2_tokens

KERNELS = (
    (v4_sparse_attention, "sparse_attention"),
    (v4_indexer, "indexer_scores"),
    (v4_compress, "compress_pool"),
)


def test_v4_kernel_path_gives_the_torch_paths_greedy_tokens(monkeypatch):
    calls = Counter()
    for module, name in KERNELS:
        real = getattr(module, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    rng = random.Random(7)
    long = smollm2_tokens(rng, 136)
    prompts = [long, smollm2_tokens(rng, 6), long[:128] + smollm2_tokens(rng, 5)]
    params = SamplingParams(
        max_tokens=2, temperature=0.0, ignore_eos=True, cache_salt=uuid.uuid4().hex
    )
    outputs, cached = {}, {}
    for backend in ("torch", "triton"):
        engine = LLMEngine(
            EngineConfig(
                model=NAME, num_kv_blocks=64, max_num_batched_tokens=160, max_num_seqs=4,
                attention_backend=backend,
            )
        )  # fmt: skip
        try:
            assert engine.runner.metadata_builder.use_kernels == (backend == "triton")
            first = engine.generate(prompts[:2], params)  # ragged: 136 and 6 tokens
            (shared,) = engine.generate(prompts[2:], params)  # the first's 128-token head
        finally:
            engine.shutdown()
        outputs[backend] = [o.token_ids for o in [*first, shared]]
        cached[backend] = shared.metrics.num_cached_tokens
    assert outputs["triton"] == outputs["torch"]
    assert cached["triton"] == cached["torch"] == 128, cached
    assert all(calls[name] > 0 for _, name in KERNELS), calls


def test_v4_kernel_path_resumes_preempted_sequences_as_the_torch_path_does():
    """Two prompts in a pool that cannot hold both as they decode: one is preempted and
    recomputed; the kernel path's greedy tokens are the torch path's."""
    rng = random.Random(11)
    prompts = [smollm2_tokens(rng, 30), smollm2_tokens(rng, 30)]  # 34 tokens: 3 blocks each
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    outputs = {}
    for backend in ("torch", "triton"):
        engine = LLMEngine(
            EngineConfig(
                model=NAME, num_kv_blocks=5, max_num_batched_tokens=64, max_num_seqs=2,
                enable_prefix_caching=False, attention_backend=backend,
            )
        )  # fmt: skip
        try:
            outputs[backend] = [o.token_ids for o in engine.generate(prompts, params)]
            assert engine.stats().num_preemptions > 0, backend
        finally:
            engine.shutdown()
    assert outputs["triton"] == outputs["torch"]
