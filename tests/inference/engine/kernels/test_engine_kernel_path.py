"""The engine with its attention on the triton kernels (CPU, interpreter) against the torch path:
same greedy tokens, through chunked prefill, prefix-cache hits and mixed prefill/decode steps."""

import random
import uuid
from collections import Counter

import pytest

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.kernels import dispatch
from inference.engine.kernels.metadata import KernelMetadataBuilder
from inference.engine.models import TINY_OVERRIDES


def _engine(backend: str, model: str) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=model, num_kv_blocks=64, max_num_batched_tokens=48,
            max_num_seqs=4, attention_backend=backend,
        )
    )  # fmt: skip


@pytest.mark.parametrize("model", ["smollm2-tiny-random", "gemma3-tiny-random"])
def test_kernel_path_gives_the_torch_paths_greedy_tokens(model, seed, monkeypatch):
    # A window of 32 tokens (two blocks) instead of 512, so that these short prompts already
    # run past it: sliding layers then read window tables that start at a later block.
    monkeypatch.setitem(TINY_OVERRIDES["gemma3"], "sliding_window", 32)
    calls = Counter()
    real_attend = dispatch.attend

    def counting_attend(q, k_cache, v_cache, meta, scale, window=None):
        calls["decode"] += meta.decode is not None
        calls["prefill"] += meta.prefill is not None
        calls["mixed"] += meta.decode is not None and meta.prefill is not None
        calls["window tables"] += any(
            b is not None and b.first_blocks is not None and int(b.first_blocks.max()) > 0
            for b in (meta.decode, meta.prefill)
        )
        return real_attend(q, k_cache, v_cache, meta, scale, window)

    monkeypatch.setattr(dispatch, "attend", counting_attend)
    rng = random.Random(seed)
    head = [rng.randrange(5, 40000) for _ in range(40)]  # shared: later prompts hit the cache
    prompts = [
        head + [rng.randrange(5, 40000) for _ in range(rng.randint(20, 60))] for _ in range(4)
    ]
    params = SamplingParams(
        max_tokens=4, temperature=0.0, ignore_eos=True, cache_salt=uuid.uuid4().hex
    )
    outputs = {}
    for backend in ("torch", "triton"):
        engine = _engine(backend, model)
        try:
            is_kernel_path = isinstance(engine.runner.metadata_builder, KernelMetadataBuilder)
            assert is_kernel_path == (backend == "triton")
            first = engine.generate(prompts[0], params)  # fills the cache with the head
            rest = engine.generate(prompts[1:], params)  # batched: prefill chunks beside decodes
            outputs[backend] = [o.token_ids for o in [*first, *rest]]
            cached = [o.metrics.num_cached_tokens for o in rest]
        finally:
            engine.shutdown()
        assert all(n >= 32 for n in cached), cached  # two 16-token blocks of the head reused
    assert outputs["triton"] == outputs["torch"]
    assert min(calls["decode"], calls["prefill"], calls["mixed"]) > 0, calls
    assert (calls["window tables"] > 0) == (model == "gemma3-tiny-random"), calls
