"""What a decode CUDA graph records, run eagerly on CPU: a padded step from the static inputs
gives the logits of the unpadded kernel step, and its padding rows write nothing to the cache.
(Capture and replay themselves need CUDA: tests/inference/engine/test_gpu_path.py.)"""

import random

import torch

from inference.engine import EngineConfig, LLMEngine
from inference.engine.attention.attention_backend import ScheduledSpan
from inference.engine.kernels.metadata import KernelAttentionMetadata, build_kernel_metadata
from inference.engine.runner.cuda_graphs import DecodeGraphs

BLOCK = 16


def _step(runner, spans, ids, positions, slots, rows):
    meta = KernelAttentionMetadata(
        torch.tensor(slots), build_kernel_metadata(spans, BLOCK, torch.device("cpu"))
    )
    return runner.model(
        torch.tensor(ids), torch.tensor(positions), runner.kv_caches, meta, torch.tensor(rows)
    )


def test_padded_decode_step_matches_the_eager_step_and_padding_writes_nothing(seed):
    engine = LLMEngine(
        EngineConfig(model="smollm2-tiny-random", num_kv_blocks=32, attention_backend="triton")
    )
    try:
        runner = engine.runner
        assert runner.graphs is None  # nothing is captured on CPU
        rng = random.Random(seed)
        free = list(range(32))
        rng.shuffle(free)
        lengths = [rng.randint(5, 40) for _ in range(3)]
        blocks = [[free.pop() for _ in range(-(-(n + 1) // BLOCK))] for n in lengths]

        def slot(seq: int, position: int) -> int:
            return blocks[seq][position // BLOCK] * BLOCK + position % BLOCK

        # Prefill the three sequences (their K/V into the cache) on the kernel path.
        spans, ids, positions, slots, start = [], [], [], [], 0
        for seq, n in enumerate(lengths):
            spans.append(ScheduledSpan(start, n, 0, blocks[seq]))
            ids += [rng.randrange(5, 40000) for _ in range(n)]
            positions += list(range(n))
            slots += [slot(seq, p) for p in range(n)]
            start += n
        _step(runner, spans, ids, positions, slots, [start - 1])

        # One decode step, eagerly and from the static inputs padded to 4 rows.
        decode = [ScheduledSpan(i, 1, n, blocks[i]) for i, n in enumerate(lengths)]
        ids = [rng.randrange(5, 40000) for _ in lengths]
        slots = [slot(i, n) for i, n in enumerate(lengths)]
        before = runner.state.cache.clone()
        eager = _step(runner, decode, ids, lengths, slots, [0, 1, 2])
        after = runner.state.cache.clone()
        runner.state.cache.copy_(before)
        # A bound of 1,024 tokens: the graph's grid has two split-K partitions, the eager one.
        graphs = DecodeGraphs(BLOCK, max_len=1024, max_num_seqs=8, device=torch.device("cpu"))
        size = graphs.prepare(ids, lengths, slots, decode)
        assert size == 4 and graphs.slot_mapping[3] == -1 and graphs.seq_lens[3] == 0
        padded = graphs.forward(runner.model, runner.kv_caches, size)
        assert padded.shape[0] == 4 and not padded.isnan().any()
        torch.testing.assert_close(padded[:3], eager, atol=1e-5, rtol=1e-5)
        # The three decode slots hold the eager step's K/V up to rounding: the padded step's
        # projections are a GEMM of another shape, which rounds differently on some CPUs
        # (AVX2 vs AVX-512). Every other slot is exactly as before: padding wrote nothing.
        written = torch.tensor(slots)
        torch.testing.assert_close(
            runner.state.cache[:, :, written], after[:, :, written], atol=1e-5, rtol=1e-5
        )
        untouched = torch.ones(runner.state.cache.shape[2], dtype=torch.bool)
        untouched[written] = False
        assert torch.equal(runner.state.cache[:, :, untouched], before[:, :, untouched])
        assert not torch.equal(after[:, :, written], before[:, :, written])  # the step wrote
        assert not graphs.can_run(decode, 3)  # no graph captured: the runner runs eagerly
    finally:
        engine.shutdown()
