"""The GPU benchmark, part 3: DeepSeek-V4 on CUDA. The mid-size packed checkpoint (FP8 linears,
FP4 experts: load_checkpoint.mid_config) written to a temporary directory and decoded at 1, 4
and 16 in flight by benchmarks/v4_step.py's measure: each step's median time, the bytes it read
(the distinct experts its tokens touched plus everything else once), their GB/s and its share of
the device-to-device copy bandwidth part 1 measured; prefill tokens/s for one prompt.

`run_v4_section(device="cpu", ...)` is the same on this machine's CPU (the torch path): what
runs where no GPU is lent (tests/benchmarks/test_v4_step.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.v4_step import (
    BOUND,
    V4StepResult,
    checkpoint_config,
    engine_for,
    ensure_checkpoint,
    measure,
)

IN_FLIGHT = (1, 4, 16)


def run_v4_section(
    device: str,
    quick: bool,
    *,
    size: str = "mid",
    in_flight: tuple[int, ...] = IN_FLIGHT,
    prompt_tokens: int | None = None,
) -> V4StepResult:
    """Write the `size` checkpoint, serve it on `device`, measure at `in_flight`."""
    prompt_tokens = prompt_tokens or (256 if quick else 1024)
    num_steps = 8 if quick else 24
    with tempfile.TemporaryDirectory(prefix="gpu-v4-") as scratch:
        checkpoint = Path(scratch)
        ensure_checkpoint(checkpoint, checkpoint_config(size))
        engine = engine_for(checkpoint, device, max(in_flight), prompt_tokens)
        try:
            return measure(
                engine, checkpoint, list(in_flight), prompt_tokens=prompt_tokens,
                num_steps=num_steps,
            )  # fmt: skip
        finally:
            engine.shutdown()


def v4_table(result: V4StepResult, copy_gbs: float | None, device_name: str) -> str:
    c = result.checkpoint
    lines = [
        f"\nDeepSeek-V4 on {device_name}: packed checkpoint ({c['num_layers']} layers, hidden "
        f"{c['hidden_size']}, {c['num_experts']} FP4 experts, top {c['num_experts_per_tok']}, "
        f"FP8 linears; {c['packed_bytes'] / 1e6:.0f} MB), {result.prompt_tokens}-token prompts, "
        "eager steps\n",
        "| in flight | decode tokens/s | step ms | experts/layer | MB read | GB/s | % of copy "
        f"| step(n)/step(1) ÷ bytes(n)/bytes(1) (≤ {BOUND}) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row, r in zip(result.rows, result.ratios(), strict=True):
        share = f"{100 * row.gb_per_s / copy_gbs:.0f}%" if copy_gbs else "—"
        lines.append(
            f"| {row.in_flight} | {row.tokens_per_s:,.1f} | {row.step_s * 1e3:.2f} "
            f"| {row.distinct_experts_per_layer:.1f} | {row.bytes / 1e6:,.1f} "
            f"| {row.gb_per_s:,.1f} | {share} "
            f"| {r['quotient']:.2f} ({'holds' if r['holds'] else 'NOT held'}) |"
        )
    if result.prefill_tokens_per_s is not None:
        lines.append(
            f"| prefill, one {result.prompt_tokens}-token prompt | "
            f"{result.prefill_tokens_per_s:,.0f} tokens/s | | | | | | |"
        )
    return "\n".join(lines)
