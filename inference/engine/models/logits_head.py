"""The logits head (hidden → vocabulary) on the CPU: a compiled loop where the BLAS is slow.

A decode step asks for the logits of a few rows (one a sequence in flight) against a weight that
is wide and short: the tiny V4's is 49,152 × 128. MKL's sgemm on the 2-core AMD EPYC here took
3.3–3.7 ms for one such row, 6.9–7.8 ms for two and 5.4–5.5 ms for eight (~10 GFLOP/s), the
largest single op of a tiny V4 decode step; `dot_rows` (each vocabulary row's dot product with
every hidden row, four vocabulary rows at a time past four hidden rows) 0.8–0.9, 1.1–1.2 and
2.6–2.7 ms (`python -m benchmarks v4-ops`, part 4, two runs). A BLAS that is fast for these
shapes (MKL on an Intel CPU) should keep them, so `LogitsHead.choose` times both on the loaded
weight once, at engine start, and the loop runs only where it won (and only for up to
MAX_COMPILED_ROWS rows, past which the BLAS caught up). On SmolLM2-135M's head (× 576) the loop
won alone but not within its decode step, so the llama family keeps nn.Linear
(docs/performance-history.md).

The loop sums in another order than the BLAS (numba's reassociation, so the sums vectorize):
the logits agree to ~1e-5, as two BLAS kernels for two batch shapes do.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F
from numba import njit
from torch import nn

from inference.engine.models.cpu_loops import fp32_cpu_inference

# Rows past which the loop is not used (at 64 rows the BLAS was as fast).
MAX_COMPILED_ROWS = 32
# The loop is chosen only when it takes at most this share of the BLAS's time.
CHOICE_MARGIN = 0.8


@njit(fastmath={"reassoc", "contract"}, cache=True)
def dot_rows(h: np.ndarray, weight: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    """out[n, v] = h[n] · weight[v]. h (N, K), weight (V, K), out (N, V), float32, C-contiguous.
    Past four rows of h, four weight rows at a time, each row of h read once for the four; up to
    four rows (and the last V % 4 weight rows), one weight row at a time, its K floats read once
    for every row of h. (Runs compiled.)"""
    num_vocab, k_dim = weight.shape
    num_rows = h.shape[0]
    blocked = num_vocab - num_vocab % 4 if num_rows > 4 else 0
    for v in range(0, blocked, 4):
        for n in range(num_rows):
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            for k in range(k_dim):
                x = h[n, k]
                a0 += weight[v, k] * x
                a1 += weight[v + 1, k] * x
                a2 += weight[v + 2, k] * x
                a3 += weight[v + 3, k] * x
            out[n, v] = a0
            out[n, v + 1] = a1
            out[n, v + 2] = a2
            out[n, v + 3] = a3
    for v in range(blocked, num_vocab):
        for n in range(num_rows):
            acc = np.float32(0.0)
            for k in range(k_dim):
                acc += weight[v, k] * h[n, k]
            out[n, v] = acc


def compiled_logits(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(N, V) = h @ weight.T through `dot_rows`; h and weight fp32 on the CPU."""
    out = np.empty((h.shape[0], weight.shape[0]), np.float32)
    dot_rows(h.contiguous().numpy(), weight.detach().contiguous().numpy(), out)
    return torch.from_numpy(out)


class LogitsHead(nn.Linear):
    """nn.Linear (no bias) whose forward runs `compiled_logits` once `choose` found it faster on
    this machine, for fp32 rows on the CPU without a gradient; F.linear otherwise."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)
        self.compiled = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.compiled and self._takes(x):
            return compiled_logits(x, self.weight)
        return F.linear(x, self.weight)

    def _takes(self, x: torch.Tensor) -> bool:
        return (
            x.dim() == 2 and x.shape[0] <= MAX_COMPILED_ROWS and fp32_cpu_inference(x, self.weight)
        )

    @torch.inference_mode()
    def choose(self, rounds: int = 5) -> str:
        """Time the loop against F.linear on this weight (1 and 8 rows, alternated, the best of
        `rounds`), keep the faster (the loop only if it takes ≤ CHOICE_MARGIN of the BLAS's time),
        and say which: one line for the engine's start."""
        self.compiled = False
        probe = torch.randn(1, self.in_features)
        if not self._takes(probe):
            return "logits head: torch (not fp32 on the CPU)"
        compiled_logits(probe, self.weight)  # compiled (or read from numba's cache) now
        best = {"loop": float("inf"), "torch": float("inf")}
        for _ in range(rounds):
            for name, fn in (("loop", compiled_logits), ("torch", F.linear)):
                started = time.perf_counter()
                for rows in (1, 8):
                    fn(torch.randn(rows, self.in_features), self.weight)
                best[name] = min(best[name], time.perf_counter() - started)
        self.compiled = best["loop"] <= CHOICE_MARGIN * best["torch"]
        chosen = "compiled loop" if self.compiled else "torch"
        return (
            f"logits head: {chosen} (1 and 8 rows: loop {best['loop'] * 1e3:.2f} ms, "
            f"torch {best['torch'] * 1e3:.2f} ms)"
        )
