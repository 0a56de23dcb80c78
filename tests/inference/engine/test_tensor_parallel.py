"""Tensor (and expert) parallelism on the CPU: gloo, 2 ranks, the worker spawned by the engine.

Each engine here starts a second process (a fresh interpreter loading the model: seconds), so
the tests are few and each checks much: greedy tokens identical to the single-process engine
and every sampled step's logits within 1e-5 relative, with prefix caching, partial-block copies,
chunked prefill and preemption all happening in the same run; a worker killed mid-run fails the
requests with a clear error, never a hang, and a new engine starts fine.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.config import ParallelConfig
from inference.engine.distributed.communicator import free_port
from inference.engine.distributed.parallel_layers import balanced_range
from inference.engine.distributed.sharding import HeadShard, head_shard
from inference.engine.request_errors import RequestError

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
TP2 = dict(tensor_parallel_size=2, distributed_timeout_s=60.0)
LOGITS_RTOL = 1e-5


def _run(model: str, prompts, params=GREEDY, **config):
    """Outputs, the logits of every sampled step (rank 0's, gathered) and the stats."""
    engine = LLMEngine(EngineConfig(model=model, num_threads=1, **config))
    runner = engine.executor.runner if engine.executor is not None else engine.runner
    logits_of_steps: list[torch.Tensor] = []
    sample = runner.sample

    def recording_sample(logits, plan):
        if plan.sampling:  # a step of prompt chunks only samples nothing
            logits_of_steps.append(logits.detach().float().clone())
        return sample(logits, plan)

    runner.sample = recording_sample
    try:
        outputs = engine.generate(prompts, params)
        return outputs, logits_of_steps, engine.stats()
    finally:
        engine.shutdown()


def _max_relative_error(got: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    assert len(got) == len(expected) > 0
    return max(
        float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, expected, strict=True)
    )


def _prompts(seed: int, vocab: int) -> list[list[int]]:
    """Prompts sharing a head that ends inside a block (token-exact reuse copies a partial
    block), longer than a step's token budget (chunked prefill)."""
    rng = random.Random(seed)
    head = [rng.randrange(vocab) for _ in range(83)]
    return [head + [rng.randrange(vocab) for _ in range(rng.randrange(5, 60))] for _ in range(5)]


# ---- the split itself (no processes) --------------------------------------------------------


def test_balanced_ranges_cover_everything_once_larger_first():
    for total, world in [(9, 2), (3, 2), (49152, 2), (7, 3), (4, 4)]:
        ranges = [balanced_range(total, r, world) for r in range(world)]
        assert [i for r in ranges for i in r] == list(range(total))
        assert max(map(len, ranges)) - min(map(len, ranges)) <= 1
        assert len(ranges[0]) >= len(ranges[-1])


def test_head_shards_keep_gqa_groups_whole_or_replicate_kv_heads():
    # SmolLM2-135M: 9 query heads over 3 KV heads, on 2 ranks: 2 groups and 1 group.
    assert head_shard(9, 3, 0, 2) == HeadShard(range(0, 6), range(0, 2))
    assert head_shard(9, 3, 1, 2) == HeadShard(range(6, 9), range(2, 3))
    # Fewer KV heads than ranks: each rank takes half a group, its KV head replicated.
    assert head_shard(4, 1, 0, 2) == HeadShard(range(0, 2), range(0, 1))
    assert head_shard(4, 1, 1, 2) == HeadShard(range(2, 4), range(0, 1))
    assert head_shard(8, 2, 3, 4) == HeadShard(range(6, 8), range(1, 2))


@pytest.mark.parametrize(
    ("heads", "kv_heads", "world", "message"),
    [
        (4, 2, 8, "leave a rank without one"),
        (6, 2, 3, "cannot be shared by 3 ranks"),
        (6, 2, 4, "cannot be shared by 4 ranks"),  # 3 query heads per KV head, 2 ranks each
    ],
)
def test_heads_that_cannot_be_split_say_why(heads, kv_heads, world, message):
    with pytest.raises(ValueError, match=message):
        head_shard(heads, kv_heads, 0, world)


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        (dict(tensor_parallel_size=0), "tensor_parallel_size must be ≥ 1"),
        (dict(enable_expert_parallel=True), "needs tensor_parallel_size ≥ 2"),
        (dict(tensor_parallel_size=2, worker_launch="ray"), "worker_launch must be one of"),
        (dict(tensor_parallel_size=2, worker_launch="external"), "needs master_port"),
        (dict(tensor_parallel_size=2, distributed_timeout_s=0), "distributed_timeout_s"),
    ],
)
def test_parallel_config_rejects_bad_values(keywords, message):
    with pytest.raises(ValueError, match=message):
        ParallelConfig(**keywords)


def test_a_tensor_parallel_config_turns_cuda_graphs_off():
    assert not EngineConfig(tensor_parallel_size=2).runner.enable_cuda_graphs
    assert EngineConfig().runner.enable_cuda_graphs


# ---- two ranks -------------------------------------------------------------------------------


def test_parallel_layers_on_two_ranks_equal_the_full_layers_with_uneven_shares():
    """Column- then row-parallel linears, the vocabulary-parallel embedding and head, with
    every size odd (7 inner columns, 11 vocabulary rows): rank 0 gets the full logits."""
    import torch.multiprocessing as mp

    from tests.inference.engine import tensor_parallel_layers as layers

    input_ids = torch.tensor([0, 5, 6, 10, 3])  # both sides of the vocabulary split
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [
        context.Process(target=layers.run_rank, args=(rank, port, input_ids, results))
        for rank in range(2)
    ]
    for rank in ranks:
        rank.start()
    got = {
        rank: torch.from_numpy(logits) for rank, logits in (results.get(timeout=120) for _ in ranks)
    }
    for rank in ranks:
        rank.join(30)
    assert [rank.exitcode for rank in ranks] == [0, 0]
    assert got[1].shape == (5, 0)
    torch.testing.assert_close(got[0], layers.reference(input_ids), rtol=1e-5, atol=1e-6)


def test_tiny_llama_on_two_ranks_matches_one_process_through_reuse_chunks_and_preemption():
    """16 blocks of 16 tokens for 5 prompts of ~90-140 tokens: requests are preempted; a step
    takes at most 64 tokens: prompts are chunked; prompts share an 83-token head: the second
    and later hit the cache, ending inside a block (a partial-block copy on every rank)."""
    prompts = _prompts(1, 49152)
    config = dict(num_kv_blocks=16, max_num_batched_tokens=64)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    expected, expected_logits, single = _run("smollm2-tiny-random", prompts, params, **config)
    got, got_logits, stats = _run("smollm2-tiny-random", prompts, params, **config, **TP2)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert _max_relative_error(got_logits, expected_logits) <= LOGITS_RTOL
    assert stats.num_preemptions > 0 and stats.num_preemptions == single.num_preemptions
    assert stats.prefix_cache_hits > 0 and stats.num_partial_block_copies > 0
    assert max(len(p) for p in prompts) > 64  # chunked


def test_tiny_gemma3_on_two_ranks_matches_one_process():
    """Sliding-window layers with their own KV group, tied vocabulary-parallel head."""
    prompts = _prompts(2, 1000)
    config = dict(num_kv_blocks=64, max_num_batched_tokens=64)
    expected, expected_logits, _ = _run("gemma3-tiny-random", prompts, **config)
    got, got_logits, stats = _run("gemma3-tiny-random", prompts, **config, **TP2)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert _max_relative_error(got_logits, expected_logits) <= LOGITS_RTOL
    assert stats.prefix_cache_hits > 0


def test_tiny_deepseek_v4_with_experts_split_matches_one_process():
    prompts = _prompts(3, 1000)
    config = dict(num_kv_blocks=128, max_num_batched_tokens=128)
    expected, expected_logits, _ = _run("deepseek-v4-tiny-random", prompts, **config)
    got, got_logits, _ = _run(
        "deepseek-v4-tiny-random", prompts, **config, **TP2, enable_expert_parallel=True
    )
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert _max_relative_error(got_logits, expected_logits) <= LOGITS_RTOL


def test_a_killed_rank_fails_the_requests_clearly_and_a_new_engine_starts():
    config = EngineConfig(
        model="smollm2-tiny-random",
        num_kv_blocks=64,
        num_threads=1,
        tensor_parallel_size=2,
        distributed_timeout_s=60.0,
    )
    engine = LLMEngine(config)
    long = SamplingParams(max_tokens=900, temperature=0.0, ignore_eos=True)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(engine.generate, [[1, 2, 3, 4]], long)
        while engine.stats().num_steps < 3:
            time.sleep(0.05)
        os.kill(engine.executor.workers.pids[1], signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(RequestError, match=r"rank 1 exited with code -9.*start a new one"):
            running.result(timeout=60)
        assert time.monotonic() - started < 15  # the collective fails; no timeout waited out
    with pytest.raises(RequestError, match="tensor-parallel engine failed"):  # at once, later too
        engine.generate([[5, 6, 7]], GREEDY, timeout=30)
    engine.shutdown()

    expected, _, _ = _run("smollm2-tiny-random", [[5, 6, 7]], num_kv_blocks=64)
    restarted = LLMEngine(config)
    try:
        got = restarted.generate([[5, 6, 7]], GREEDY, timeout=60)
        assert got[0].token_ids == expected[0].token_ids
        # A worker that dies while the engine is idle: the watchdog fails the engine.
        os.kill(restarted.executor.workers.pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 15
        while restarted.executor.failure is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "rank 1 exited with code -9" in str(restarted.executor.failure)
        with pytest.raises(RequestError, match="rank 1 exited"):
            restarted.generate([[5, 6, 7]], GREEDY, timeout=30)
    finally:
        restarted.shutdown()


def test_a_worker_started_on_its_own_joins_rank_0_and_leaves_at_shutdown():
    """The two-machine path on one machine: rank 1 from the command line, the engine waiting for
    it at master_addr:master_port (worker_launch="external")."""
    port = free_port()
    root = Path(__file__).resolve().parents[3]
    worker = subprocess.Popen(
        [sys.executable, "-m", "inference.engine.distributed.worker", "--rank=1",
         "--world-size=2", "--master-addr=127.0.0.1", f"--master-port={port}", "--timeout=60"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    try:
        engine = LLMEngine(
            EngineConfig(
                model="smollm2-tiny-random",
                num_kv_blocks=32,
                num_threads=1,
                tensor_parallel_size=2,
                worker_launch="external",
                master_port=port,
                distributed_timeout_s=60.0,
            )
        )
        try:
            got = engine.generate([[9, 8, 7, 6]], GREEDY)
        finally:
            engine.shutdown()
        assert worker.wait(timeout=30) == 0  # told to stop, it left cleanly
    finally:
        if worker.poll() is None:
            worker.kill()
    expected, _, _ = _run("smollm2-tiny-random", [[9, 8, 7, 6]], num_kv_blocks=32)
    assert got[0].token_ids == expected[0].token_ids


@pytest.mark.real_model
def test_smollm2_on_two_ranks_matches_one_process():
    """9 query heads over 3 KV heads: rank 0 holds 6 and 2, rank 1 holds 3 and 1."""
    prompts = ["The capital of France is", "Write a haiku about a town square at dawn."]
    config = dict(num_kv_blocks=64)
    expected, expected_logits, _ = _run("smollm2-135m-instruct", prompts, **config)
    got, got_logits, _ = _run("smollm2-135m-instruct", prompts, **config, **TP2)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert _max_relative_error(got_logits, expected_logits) <= LOGITS_RTOL
