"""The activation/runtime reserve the memory plan assumes beside weights and KV, per rank.

A fixed runtime part (CUDA: 1 GiB for the context, cuBLAS/triton workspaces and allocator slack;
CPU: 0.5 GiB for the interpreter, torch and the tokenizer) plus one step's activations at
max_num_batched_tokens in fp32 — a few hidden-wide copies, the attention queries and output, the
MLP's intermediates, the attention scores against a talk-sized context (12,361 tokens, or the
model's context if shorter; V4: the lightning indexer's per-head scores), the logits of
max_num_seqs rows — and, on the CPU, the largest packed weight dequantized to fp32 (the CPU path
dequantizes per call; CUDA's kernels dequantize in registers). An estimate, not a measurement,
meant to err high.
"""

from __future__ import annotations

import math

from inference.engine.config import EngineConfig
from inference.engine.memory_plan.model_spec import ModelSpec

GIB = 1 << 30
TALK_CONTEXT = 12_310 + 51
_RUNTIME_BYTES = {"cuda": GIB, "cpu": GIB // 2}


def reserve_bytes(
    spec: ModelSpec, config: EngineConfig, device_type: str, max_len: int
) -> tuple[int, str]:
    """The reserve one rank keeps beside weights and KV, and what it assumes (a line for the
    plan's table)."""
    tokens = config.scheduler.max_num_batched_tokens
    context = min(TALK_CONTEXT, max_len)
    c = spec.config
    if spec.arch == "deepseek_v4":
        width = (
            3 * c.hc_mult * c.hidden_size  # the residual streams in, out and mixed
            + 2 * c.num_heads * c.head_dim  # queries and attention output
            + c.index_n_heads * math.ceil(context / c.csa_rate)  # the indexer's per-head scores
            + 3 * c.num_experts_per_tok * c.moe_intermediate_size  # routed experts' gate, up, act
        )
    else:
        qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
        width = 4 * c.hidden_size + 2 * qkv + 3 * c.intermediate_size + c.num_heads * context
    logits = config.scheduler.max_num_seqs * c.vocab_size
    runtime = _RUNTIME_BYTES[device_type]
    activations = 4 * (tokens * width + logits)
    note = (
        f"runtime {_gib(runtime)} + a {tokens:,}-token step's fp32 activations {_gib(activations)}"
    )
    scratch = 0
    if device_type == "cpu" and spec.formats.experts is not None:
        # One expert's (or the widest linear's) weight dequantized per call: fp32 scratch.
        scratch = 4 * max(
            2 * c.moe_intermediate_size * c.hidden_size, c.num_heads * c.head_dim * c.q_lora_rank
        )
        note += f" + dequantized-weight scratch {_gib(scratch)}"
    return runtime + activations + scratch, note


def _gib(size: float) -> str:
    return f"{size / GIB:,.2f} GiB"
