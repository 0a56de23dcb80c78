"""`python -m benchmarks v4-ops`: what a DeepSeek-V4 step costs in small ops on the CPU.

1. The torch ops of one decode step of the tiny V4 through the engine, `--in-flight` sequences
   decoding together (their prompts the town workload's, cached first), counted by a dispatch
   mode, by the model file that issued them: on the CPU an op costs more than its arithmetic at
   decode sizes, so the count is what the step's time follows.
2. A hyper-connection (the tiny V4's: 4 streams) at 8 and 800 tokens, the CPU's compiled gates
   and Sinkhorn (deepseek_v4.hyper_connections_cpu) against the tensor-op form other devices
   run, alternated in one process, µs a call.
3. Three pieces of a 1,024-token prefill chunk at the tiny V4's shapes, each form against the
   one it replaced, alternated, µs a call: the streams mixed back (compiled loop / tensor ops);
   the routed experts (expert by expert / padded to one batch), routed by the tiny checkpoint's
   hash layer on a town prompt's last 1,024 tokens, whose uneven routing is what padding
   wastes; a tile chunk's window logits masked (a bias added / masked_fill with a mask
   broadcast over the heads).
4. The logits head at the tiny V4's shape (49,152 × 128) for 1, 2 and 8 rows: the compiled loop
   (models/logits_head.py) against F.linear, alternated, µs a call.
5. The RMS norms at a prefill chunk's and a decode step's rows, over the hyper-connection's
   4 × 128 streams and the hidden 128: the compiled loop (deepseek_v4.norms_cpu) against torch's
   rms_norm, alternated, µs a call.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.lib.workload import build_workload, chat_tokenizer_for
from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.models import grouped_experts, load_model
from inference.engine.models.deepseek_v4.config import DeepseekV4Config
from inference.engine.models.deepseek_v4.hyper_connections import (
    HyperConnection,
    mix_compiled,
    mix_tensor_ops,
)
from inference.engine.models.deepseek_v4.norms_cpu import compiled_rms_norm
from inference.engine.models.deepseek_v4.tiled_attention import mask_bias
from inference.engine.models.deepseek_v4.tiny import TINY_CONFIG
from inference.engine.models.logits_head import compiled_logits
from inference.engine.runner.model_runner import ModelRunner

MODEL = "deepseek-v4-tiny-random"


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--in-flight", type=int, default=8, help="sequences decoding together")
    parser.add_argument("--calls", type=int, default=200, help="calls of each timed form")


def main(args: argparse.Namespace) -> int:
    if args.in_flight < 1 or args.calls < 1:
        raise ValueError("--in-flight and --calls must be ≥ 1")
    torch.set_num_threads(1)
    by_file = count_decode_ops(args.in_flight)
    print(f"{MODEL}: one decode step at {args.in_flight} in flight, one torch thread")
    print(f"torch ops: {sum(by_file.values())}")
    for where, count in by_file.most_common():
        print(f"  {count:5d}  {where}")
    print("hyper-connection, µs a call (compiled loop / tensor ops):")
    for tokens in (8, 800):
        compiled, tensor_ops = time_hyper_connection(tokens, args.calls)
        print(f"  {tokens:4d} tokens: {compiled:8.1f} / {tensor_ops:8.1f}")
    print(f"a {PREFILL_TOKENS}-token prefill chunk, µs a call (this form / the one it replaced):")
    for name, (new, old) in time_prefill_pieces(args.calls).items():
        print(f"  {name}: {new:8.1f} / {old:8.1f}")
    print(f"the logits head ({HEAD_VOCAB:,} × {TINY_CONFIG['hidden_size']}), µs a call "
          "(compiled loop / torch):")  # fmt: skip
    for rows, (loop, linear) in time_logits_head(args.calls).items():
        print(f"  {rows:4d} rows: {loop:8.1f} / {linear:8.1f}")
    print("RMS norms, µs a call (compiled loop / torch):")
    for shape, (loop, torch_op) in time_norms(args.calls).items():
        print(f"  {' × '.join(map(str, shape))}: {loop:8.1f} / {torch_op:8.1f}")
    return 0


class _OpCounter(TorchDispatchMode):
    """Counts every op dispatched, by the model file (below inference/) that issued it."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        frame = sys._getframe(1)
        while frame is not None and "/inference/" not in frame.f_code.co_filename:
            frame = frame.f_back
        where = frame.f_code.co_filename.rpartition("/inference/")[2] if frame else "other"
        self.counts[where] += 1
        return func(*args, **(kwargs or {}))


def count_decode_ops(in_flight: int) -> collections.Counter[str]:
    """The ops of the last decode step of `in_flight` sequences (every one at its prompt's end
    plus a few tokens), counted on the engine's own thread."""
    engine = LLMEngine(EngineConfig(model=MODEL, num_threads=1))
    counter, original = _OpCounter(), ModelRunner.forward
    steps: list[int] = []

    def forward(runner, batch):
        if len(batch.input_ids) != in_flight:
            return original(runner, batch)
        steps.append(1)
        if len(steps) != 4:  # the fourth step at full batch: every prompt done, windows warm
            return original(runner, batch)
        with counter:
            return original(runner, batch)

    try:
        workload = build_workload(chat_tokenizer_for(engine.tokenizer), num_requests=in_flight)
        prompts = workload.requests[:in_flight]
        engine.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0))
        ModelRunner.forward = forward
        engine.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    finally:
        ModelRunner.forward = original
        engine.shutdown()
    if len(steps) < 4:
        raise ValueError(f"fewer than 4 decode steps ran at {in_flight} in flight")
    return counter.counts


def time_hyper_connection(tokens: int, calls: int) -> tuple[float, float]:
    """µs a call of the tiny V4's hyper-connection gates: the CPU's compiled loop, the tensor
    ops; alternated in rounds of calls / 10."""
    hyper = HyperConnection(_tiny_config())
    generator = torch.Generator().manual_seed(tokens)
    with torch.no_grad():
        hyper.base.copy_(torch.randn(hyper.base.shape, generator=generator))
        hyper.scale.copy_(torch.rand(3, generator=generator) + 0.5)
    mixes = torch.randn(tokens, hyper.base.numel(), generator=generator)
    return _alternated(lambda: hyper._gates_compiled(mixes), lambda: hyper.gates(mixes), calls)


PREFILL_TOKENS = 1024


def time_prefill_pieces(calls: int) -> dict[str, tuple[float, float]]:
    config, tokens = _tiny_config(), PREFILL_TOKENS
    generator = torch.Generator().manual_seed(tokens)
    n, hidden = config.hc_mult, config.hidden_size
    post = torch.rand(tokens, n, generator=generator)
    comb = torch.rand(tokens, n, n, generator=generator)
    out = torch.randn(tokens, hidden, generator=generator)
    streams = torch.randn(tokens, n, hidden, generator=generator)

    # The tiny V4's own hash-routed layer on a town prompt's tokens: the routing a prefill sees.
    loaded = load_model(MODEL, torch.device("cpu"))
    workload = build_workload(chat_tokenizer_for(loaded.tokenizer), num_requests=1)
    ids = torch.tensor(loaded.tokenizer.apply_chat_template(workload.requests[0])[-tokens:])
    moe = loaded.model.model.layers[1].mlp
    experts = moe.experts
    x = torch.randn(len(ids), hidden, generator=generator)
    with torch.inference_mode():
        indices, weights = moe.gate(x, ids)
    groups = grouped_experts.group_by_expert(indices, weights, experts.expert_ids)
    gate_up, down = experts.gate_up_proj.detach(), experts.down_proj.detach()

    def experts_with(budget: int):
        def run():
            grouped_experts.PADDING_WASTE_BUDGET = budget
            try:
                grouped_experts.grouped_swiglu(x, groups, gate_up, down, experts.limit, x.dtype)
            finally:
                grouped_experts.PADDING_WASTE_BUDGET = budget_now

        return run

    budget_now = grouped_experts.PADDING_WASTE_BUDGET
    tiles, size, keys = tokens // 32 + 1, 32, 32 + config.sliding_window - 1
    logits = torch.randn(tiles, size, config.num_heads, keys, generator=generator)
    mask = torch.rand(tiles, size, keys, generator=generator) > 0.2
    bias = mask_bias(mask)
    return {
        "streams mixed back": _alternated(
            lambda: mix_compiled(post, comb, out, streams),
            lambda: mix_tensor_ops(post, comb, out, streams),
            calls,
        ),
        "routed experts": _alternated(experts_with(-1), experts_with(1 << 60), calls),
        "window logits masked": _alternated(
            lambda: logits.clone().add_(bias[:, :, None, :]),
            lambda: logits.clone().masked_fill_(~mask[:, :, None, :], float("-inf")),
            calls,
        ),
    }


HEAD_VOCAB = 49_152  # the tiny V4's vocabulary (SmolLM2's tokenizer)


def time_logits_head(calls: int) -> dict[int, tuple[float, float]]:
    generator = torch.Generator().manual_seed(HEAD_VOCAB)
    weight = torch.randn(HEAD_VOCAB, TINY_CONFIG["hidden_size"], generator=generator)
    times = {}
    for rows in (1, 2, 8):
        h = torch.randn(rows, weight.shape[1], generator=generator)
        times[rows] = _alternated(
            lambda h=h: compiled_logits(h, weight), lambda h=h: F.linear(h, weight), calls
        )
    return times


def time_norms(calls: int) -> dict[tuple[int, int], tuple[float, float]]:
    """µs a call of an RMS norm (weighted) at the tiny V4's widths, a 1,024-token prefill
    chunk's rows and a decode step's 8: the compiled loop, torch's rms_norm."""
    generator = torch.Generator().manual_seed(5)
    times = {}
    hidden = TINY_CONFIG["hidden_size"]
    for shape in ((PREFILL_TOKENS, TINY_CONFIG["hc_mult"] * hidden), (PREFILL_TOKENS, hidden),
                  (8, TINY_CONFIG["hc_mult"] * hidden), (8, hidden)):  # fmt: skip
        x = torch.randn(shape, generator=generator)
        weight = torch.rand(shape[1], generator=generator) + 0.5
        times[shape] = _alternated(
            lambda x=x, w=weight: compiled_rms_norm(x, w, 1e-6),
            lambda x=x, w=weight: F.rms_norm(x, (x.shape[1],), w, 1e-6),
            calls,
        )
    return times


def _tiny_config() -> DeepseekV4Config:
    return DeepseekV4Config.from_hf_config(dict(TINY_CONFIG, vocab_size=64))


def _alternated(first, second, calls: int) -> tuple[float, float]:
    """µs a call of each, after one call of each, alternated in 10 rounds of calls / 10."""
    totals = [0.0, 0.0]
    rounds, per_round = 10, max(1, calls // 10)
    with torch.inference_mode():
        first(), second()  # compiled (or loaded from numba's cache) before timing
        for _ in range(rounds):
            for i, run in enumerate((first, second)):
                start = time.perf_counter()
                for _ in range(per_round):
                    run()
                totals[i] += time.perf_counter() - start
    return tuple(1e6 * total / (rounds * per_round) for total in totals)
