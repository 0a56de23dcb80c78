"""DeepSeek-V4's RMS norms on the CPU as one compiled loop (numba): each row's mean square, then
the row scaled, two passes over it where torch's rms_norm on the CPU is a chain of whole-tensor
ops (square, mean, add, rsqrt, two products: ~6 passes and a temporary each). A V4 step runs
dozens: a prefill chunk's (1,024 × 512) hyper-connection norm took 190–196 µs in torch and
82–84 in the loop on the 2-core AMD EPYC here, a decode step's (8 × 512) 11.9 against 7.5–7.6
(`python -m benchmarks v4-ops`, part 5, two runs).

The loop sums each row's squares in another order than torch (numba's reassociation, so the
sum vectorizes): the two agree to ~1e-6 relative, as two kernels of one BLAS do.
Compiled at model load (`warm`, beside hyper_connections_cpu's) and cached on disk.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from inference.engine.models.cpu_loops import fp32_cpu_inference


@njit(fastmath={"reassoc", "contract"}, cache=True)
def rms_rows(
    x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray
) -> None:  # pragma: no cover
    """out[r] = x[r] / sqrt(mean(x[r]²) + eps) · weight. x and out (R, N), weight (N,), float32,
    C-contiguous. (Runs compiled.)"""
    num_rows, n = x.shape
    e = np.float32(eps)
    for r in range(num_rows):
        acc = np.float32(0.0)
        for i in range(n):
            acc += x[r, i] * x[r, i]
        inverse = np.float32(1.0) / np.sqrt(acc / np.float32(n) + e)
        for i in range(n):
            out[r, i] = x[r, i] * inverse * weight[i]


def runs_compiled(x: torch.Tensor, weight: torch.Tensor | None) -> bool:
    """Whether the loop takes this norm: fp32 on the CPU, no gradient asked for."""
    return fp32_cpu_inference(x) if weight is None else fp32_cpu_inference(x, weight)


_ONES: dict[int, np.ndarray] = {}


def compiled_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x's shape: RMS-normed over its last dimension, times weight (none: ones) (runs_compiled)."""
    n = x.shape[-1]
    rows = x.detach().reshape(-1, n).contiguous().numpy()
    if weight is None:
        scale = _ONES.get(n)
        if scale is None:
            scale = _ONES[n] = np.ones(n, np.float32)
    else:
        scale = weight.detach().contiguous().numpy()
    out = np.empty_like(rows)
    rms_rows(rows, scale, eps, out)
    return torch.from_numpy(out).view(x.shape)


def warm() -> None:
    """Compile the loop (or load it from numba's cache) now, not in the first request's step."""
    rms_rows(
        np.ones((1, 8), np.float32), np.ones(8, np.float32), 1e-6, np.empty((1, 8), np.float32)
    )
