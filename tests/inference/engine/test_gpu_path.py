"""The GPU path on a real GPU (tests marked gpu: skipped without CUDA; the same kernels are
checked on CPU under the interpreter in kernels/). With triton kernels and CUDA graphs the
engine must give the greedy tokens of the CPU torch path, and the graphs must be replayed.
Which batch sizes get a graph is plain logic, checked everywhere."""

import random
import uuid

import pytest
import torch

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.runner.cuda_graphs import graph_batch_sizes

gpu = pytest.mark.gpu


def _tokens(device: str, **overrides) -> tuple[list[list[int]], LLMEngine]:
    rng = random.Random(7)
    head = [rng.randrange(5, 40000) for _ in range(70)]
    tails = [[rng.randrange(5, 40000) for _ in range(rng.randint(1, 90))] for _ in range(6)]
    prompts = [head + tail for tail in tails]
    config = dict(model="smollm2-tiny-random", num_kv_blocks=128, max_num_batched_tokens=64,
                  max_num_seqs=8, device=device)  # fmt: skip
    config.update(overrides)
    engine = LLMEngine(EngineConfig(**config))
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True,
                            cache_salt=uuid.uuid4().hex)  # fmt: skip
    try:
        first = engine.generate(prompts[0], params)
        rest = engine.generate(prompts[1:], params)
        return [o.token_ids for o in [*first, *rest]], engine
    finally:
        engine.shutdown()


@gpu
def test_cuda_kernels_and_graphs_give_the_cpu_torch_paths_tokens():
    expected, _ = _tokens("cpu")
    # fp32 on the GPU so the comparison is exact: the kernels' fp32 dots are IEEE, not TF32.
    with_graphs, engine = _tokens("cuda", dtype="float32")
    assert engine.runner.graphs is not None and engine.runner.graphs.num_replays > 0
    without_graphs, engine = _tokens("cuda", dtype="float32", enable_cuda_graphs=False)
    assert engine.runner.graphs is None
    assert with_graphs == expected
    assert without_graphs == expected


@gpu
def test_bf16_engine_runs_and_its_kv_cache_is_bf16():
    tokens, engine = _tokens("cuda")
    assert engine.runner.state.cache.dtype == torch.bfloat16
    assert all(len(t) == 10 for t in tokens)


@pytest.mark.parametrize(
    ("max_num_seqs", "sizes"),
    [(1, [1]), (5, [1, 2, 4, 8]), (8, [1, 2, 4, 8]), (64, [1, 2, 4, 8, 16, 32, 64]),
     (200, [1, 2, 4, 8, 16, 32, 64])],
)  # fmt: skip
def test_graph_batch_sizes_cover_max_num_seqs_up_to_64(max_num_seqs, sizes):
    assert graph_batch_sizes(max_num_seqs) == sizes
