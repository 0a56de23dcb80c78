"""mHC on the CPU as compiled loops (numba): a hyper-connection's gates from its mixes (pre and
post through sigmoids, comb through a row softmax) and comb's Sinkhorn, a few floats a token
where the tensor-op form (hyper_connections.HyperConnection.gates, run on other devices) is
~20 small ops, each of which costs more than its arithmetic at decode sizes; and the streams
collapsed into a block's input and mixed back (`collapse`, `mix_into`), where the tensor form
is a batch of n × n matrix products per token (about 3x slower at a 1,024-token prefill
chunk).

The Sinkhorn normalizes each token's 4 × 4 matrix in place, in the order of
hyper_connections.sinkhorn (columns first, then rows and columns `iters` - 1 times, each sum
+ eps, summed in index order), in float32, multiplying by each sum's reciprocal where the tensor
form divides by it: the two agree to ~1e-6 relative. The gates and the Sinkhorn compile with
numpy's error model (a division by zero gives inf, as in numpy, where Python's raises; every
divisor here is a sum of positive floats plus eps): without a check on every division the
loops vectorize. The gates with the Sinkhorn: ~10x faster than the tensor ops at decode sizes,
~3x at a prefill chunk's 800 tokens. `python -m benchmarks v4-ops` times the gates and the mix
against their tensor forms. The loops are written for four streams (STREAMS); a model with
another count runs the tensor ops.

Compiled at model load on the CPU (`warm`) and cached on disk (numba's cache): the first
process pays the ~1 s compile, later ones load it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# The streams the compiled loops are written for: every V4 checkpoint's hc_mult. The Sinkhorn's
# sums and scalings are spelled out for four, which lets each run across the tokens' lanes
# (~4x faster than the same loop over a stream count known only at run time: the loops over the
# count were innermost and did not vectorize). Other counts run the tensor ops.
STREAMS = 4
# Tokens the Sinkhorn normalizes side by side, each in its own SIMD lane.
LANES = 64


@njit(cache=True, error_model="numpy")
def sinkhorn_in_place(c: np.ndarray, iters: int, eps: float) -> None:  # pragma: no cover
    """c: (T, 4, 4) float32, C-contiguous; normalized in place, LANES tokens at a time with the
    token innermost (entry 4·i + j of a (16, LANES) block), so each sum and scaling runs
    across tokens' lanes (a token's own 4 × 4 matrix is too small to vectorize). (Runs
    compiled: numba.)"""
    if c.shape[1] != STREAMS or c.shape[2] != STREAMS:
        raise ValueError("sinkhorn_in_place takes 4 x 4 matrices")
    num_tokens = c.shape[0]
    e, one = np.float32(eps), np.float32(1.0)
    block = np.empty((STREAMS * STREAMS, LANES), np.float32)
    for t0 in range(0, num_tokens, LANES):
        b = min(LANES, num_tokens - t0)
        for t in range(b):
            for i in range(STREAMS):
                for j in range(STREAMS):
                    block[4 * i + j, t] = c[t0 + t, i, j]
        for step in range(2 * iters - 1):  # columns first, then rows and columns in turn
            for a in range(STREAMS):
                # column a: entries a, 4 + a, 8 + a, 12 + a; row a: 4a .. 4a + 3
                first, stride = (a, 4) if step % 2 == 0 else (4 * a, 1)
                r0, r1, r2, r3 = first, first + stride, first + 2 * stride, first + 3 * stride
                for t in range(b):
                    scale = one / (block[r0, t] + block[r1, t] + block[r2, t] + block[r3, t] + e)
                    block[r0, t] *= scale
                    block[r1, t] *= scale
                    block[r2, t] *= scale
                    block[r3, t] *= scale
        for t in range(b):
            for i in range(STREAMS):
                for j in range(STREAMS):
                    c[t0 + t, i, j] = block[4 * i + j, t]


@njit(cache=True, error_model="numpy")
def hyper_gates(
    mixes: np.ndarray,  # (T, (2 + n) · n) float32: pre, post and comb's logits
    scale: np.ndarray,  # (3,) float32
    base: np.ndarray,  # ((2 + n) · n,) float32
    iters: int,
    eps: float,
    pre: np.ndarray,  # (T, n) float32, written
    post: np.ndarray,  # (T, n) float32, written
    comb: np.ndarray,  # (T, n, n) float32, written
) -> None:  # pragma: no cover
    """HyperConnection's gates from its mixes, in float32: pre = sigmoid(scale₀ · m + b) + eps,
    post = 2 · sigmoid(scale₁ · m + b), comb = Sinkhorn(softmax over each row of
    scale₂ · m + b, + eps). (Runs compiled: numba.)"""
    n = pre.shape[1]
    one, e = np.float32(1.0), np.float32(eps)
    for t in range(mixes.shape[0]):
        for k in range(n):
            z = mixes[t, k] * scale[0] + base[k]
            pre[t, k] = one / (one + np.exp(-z)) + e
            z = mixes[t, n + k] * scale[1] + base[n + k]
            post[t, k] = np.float32(2.0) / (one + np.exp(-z))
        for i in range(n):
            row = 2 * n + i * n
            top = mixes[t, row] * scale[2] + base[row]
            for j in range(1, n):
                top = max(top, mixes[t, row + j] * scale[2] + base[row + j])
            total = np.float32(0.0)
            for j in range(n):
                v = np.exp(mixes[t, row + j] * scale[2] + base[row + j] - top)
                comb[t, i, j] = v
                total += v
            for j in range(n):
                comb[t, i, j] = comb[t, i, j] / total + e
    sinkhorn_in_place(comb, iters, eps)


@njit(cache=True)
def collapse(
    pre: np.ndarray,  # (T, n) float32
    streams: np.ndarray,  # (T, n, D) float32
    out: np.ndarray,  # (T, D) float32, written: Σ_j pre[t, j] · streams[t, j]
) -> None:  # pragma: no cover
    """The streams weighted by pre and summed, a block's input. (Runs compiled: numba.)"""
    for t in range(streams.shape[0]):
        for d in range(streams.shape[2]):
            out[t, d] = pre[t, 0] * streams[t, 0, d]
        for j in range(1, streams.shape[1]):
            w = pre[t, j]
            for d in range(streams.shape[2]):
                out[t, d] += w * streams[t, j, d]


@njit(cache=True)
def mix_into(
    post: np.ndarray,  # (T, n) float32
    comb: np.ndarray,  # (T, n, n) float32
    block: np.ndarray,  # (T, D) float32: the block's output
    streams: np.ndarray,  # (T, n, D) float32
    out: np.ndarray,  # (T, n, D) float32, written
) -> None:  # pragma: no cover
    """out[t, k] = post[t, k] · block[t] + Σ_j comb[t, j, k] · streams[t, j]: the block's output
    spread over the streams, plus the streams mixed. (Runs compiled: numba.)"""
    n = streams.shape[1]
    for t in range(streams.shape[0]):
        for k in range(n):
            p = post[t, k]
            for d in range(streams.shape[2]):
                out[t, k, d] = p * block[t, d]
            for j in range(n):
                c = comb[t, j, k]
                for d in range(streams.shape[2]):
                    out[t, k, d] += c * streams[t, j, d]


def warm() -> None:
    """Compile the loops (or load them from numba's cache) on one token: ~1 s at engine start
    instead of in the first request's step."""
    n = 4
    mixes = np.zeros((1, (2 + n) * n), np.float32)
    pre, post = np.empty((1, n), np.float32), np.empty((1, n), np.float32)
    comb = np.empty((1, n, n), np.float32)
    hyper_gates(
        mixes, np.ones(3, np.float32), np.zeros((2 + n) * n, np.float32), 2, 1e-6, pre, post, comb
    )
    streams = np.zeros((1, n, 8), np.float32)
    collapse(pre, streams, np.empty((1, 8), np.float32))
    mix_into(post, comb, np.zeros((1, 8), np.float32), streams, np.empty_like(streams))
