"""Manifold-constrained hyper-connections (mHC): the residual stream as hc_mult parallel
streams, collapsed into each block's input and mixed back with a doubly-stochastic matrix."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.models.cpu_loops import fp32_cpu_inference
from inference.engine.models.deepseek_v4.config import DeepseekV4Config
from inference.engine.models.deepseek_v4.hyper_connections_cpu import STREAMS
from inference.engine.models.deepseek_v4.layers import unweighted_rms_norm

# ---- hyper-connections ------------------------------------------------------------------------


def runs_compiled(streams: torch.Tensor) -> bool:
    """Whether the CPU's compiled loops (hyper_connections_cpu) take these streams: four of
    them, fp32 on the CPU, no gradient asked for."""
    return streams.shape[1] == STREAMS and fp32_cpu_inference(streams)


class HyperConnection(nn.Module):
    """mHC: from the hc_mult streams, weights to collapse them into a block's input (pre), to
    spread its output back (post), and a doubly-stochastic mix of the streams (comb)."""

    def __init__(self, config: DeepseekV4Config) -> None:
        super().__init__()
        n = config.hc_mult
        self.hc_mult, self.iters, self.eps = n, config.hc_sinkhorn_iters, config.hc_eps
        self.norm_eps = config.rms_norm_eps
        self.fn = nn.Parameter(torch.zeros((2 + n) * n, n * config.hidden_size))
        self.base = nn.Parameter(torch.zeros((2 + n) * n))
        self.scale = nn.Parameter(torch.ones(3))
        self._arrays: tuple[tuple[int, int], tuple[np.ndarray, np.ndarray]] | None = None

    def forward(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        flat = unweighted_rms_norm(streams.flatten(1).float(), self.norm_eps)  # (T, n·hidden)
        mixes = F.linear(flat, self.fn.float())  # (T, (2 + n)·n): pre, post and comb's logits
        if runs_compiled(streams):  # gates 74 against 760 µs at 8 tokens, 858 / 1,491 at 800
            from inference.engine.models.deepseek_v4.hyper_connections_cpu import collapse

            pre, post, comb = self._compiled_gate_arrays(mixes)
            collapsed = np.empty((streams.shape[0], streams.shape[2]), np.float32)
            collapse(pre, streams.contiguous().numpy(), collapsed)
            return torch.from_numpy(post), torch.from_numpy(comb), torch.from_numpy(collapsed)
        pre, post, comb = self.gates(mixes)
        collapsed = torch.bmm(pre.to(streams.dtype).unsqueeze(1), streams)[:, 0]  # (T, hidden)
        return post, comb, collapsed

    def gates(self, mixes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """pre (T, n), post (T, n) and comb (T, n, n) from the mixes, as tensor ops."""
        n = self.hc_mult
        pre, post, comb = mixes.split([n, n, n * n], dim=-1)
        pre_b, post_b, comb_b = self.base.float().split([n, n, n * n])
        pre_s, post_s, comb_s = self.scale.float().unbind(0)
        pre = torch.sigmoid(pre * pre_s + pre_b) + self.eps
        post = 2 * torch.sigmoid(post * post_s + post_b)
        comb = torch.softmax(comb.view(-1, n, n) * comb_s + comb_b.view(n, n), dim=-1) + self.eps
        return pre, post, sinkhorn(comb, self.iters, self.eps)

    def _gates_compiled(self, mixes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """gates' pre, post and comb through the CPU's compiled loop."""
        return tuple(torch.from_numpy(a) for a in self._compiled_gate_arrays(mixes))

    def _compiled_gate_arrays(self, mixes: torch.Tensor) -> tuple[np.ndarray, ...]:
        from inference.engine.models.deepseek_v4.hyper_connections_cpu import hyper_gates

        n, num_tokens = self.hc_mult, mixes.shape[0]
        pre, post = np.empty((num_tokens, n), np.float32), np.empty((num_tokens, n), np.float32)
        comb = np.empty((num_tokens, n, n), np.float32)
        scale, base = self._parameter_arrays()
        hyper_gates(mixes.contiguous().numpy(), scale, base, self.iters, self.eps, pre, post, comb)
        return pre, post, comb

    def _parameter_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """scale and base as fp32 arrays: views of the parameters, made again only when either
        is another tensor (at a decode step the conversions were ~28 small torch ops a call);
        a parameter in another dtype is converted each call."""
        params = (self.scale, self.base)
        if any(p.dtype != torch.float32 for p in params):
            return tuple(p.detach().float().numpy() for p in params)
        key = tuple(p.data_ptr() for p in params)
        if self._arrays is None or self._arrays[0] != key:
            self._arrays = (key, tuple(p.detach().numpy() for p in params))
        return self._arrays[1]


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """(T, n, n): Sinkhorn-Knopp on each token's matrix, columns normalized first, then `iters`
    - 1 rounds of rows then columns (each sum + eps), as whole-array ops (the CPU runs
    hyper_connections_cpu's compiled loop instead). Computed as (n, n, T) so every sum and
    division runs along the tokens' contiguous lanes (over (T, n, n) each sums n floats at a
    time, and the 20 rounds of small ops cost several times more)."""
    c = comb.permute(1, 2, 0).clone(memory_format=torch.contiguous_format)  # (n, n, T), a copy
    c /= c.sum(dim=0, keepdim=True).add_(eps)
    for _ in range(iters - 1):
        c /= c.sum(dim=1, keepdim=True).add_(eps)  # rows
        c /= c.sum(dim=0, keepdim=True).add_(eps)  # columns
    return c.permute(2, 0, 1).contiguous()  # (T, n, n): mix's product is slow on the view


class HyperHead(nn.Module):
    def __init__(self, config: DeepseekV4Config) -> None:
        super().__init__()
        n = config.hc_mult
        self.eps, self.norm_eps = config.hc_eps, config.rms_norm_eps
        self.hc_fn = nn.Parameter(torch.zeros(n, n * config.hidden_size))
        self.hc_base = nn.Parameter(torch.zeros(n))
        self.hc_scale = nn.Parameter(torch.ones(1))

    def forward(self, streams: torch.Tensor) -> torch.Tensor:
        flat = unweighted_rms_norm(streams.flatten(1).float(), self.norm_eps)
        mixes = F.linear(flat, self.hc_fn.float())
        pre = torch.sigmoid(mixes * self.hc_scale.float() + self.hc_base.float()) + self.eps
        return (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)


def mix(
    post: torch.Tensor, comb: torch.Tensor, out: torch.Tensor, streams: torch.Tensor
) -> torch.Tensor:
    """The block's output spread over the streams, plus the streams mixed (comb read as
    sum_j comb[j, k] · stream_j): the CPU's compiled loop where it takes them, else tensor ops."""
    if runs_compiled(streams) and out.dtype == torch.float32:
        return mix_compiled(post, comb, out, streams)
    return mix_tensor_ops(post, comb, out, streams)


def mix_compiled(
    post: torch.Tensor, comb: torch.Tensor, out: torch.Tensor, streams: torch.Tensor
) -> torch.Tensor:
    from inference.engine.models.deepseek_v4.hyper_connections_cpu import mix_into

    mixed = np.empty(streams.shape, np.float32)
    arrays = (t.contiguous().numpy() for t in (post, comb, out, streams))
    mix_into(*arrays, mixed)
    return torch.from_numpy(mixed)


def mix_tensor_ops(
    post: torch.Tensor, comb: torch.Tensor, out: torch.Tensor, streams: torch.Tensor
) -> torch.Tensor:
    dtype = streams.dtype
    return post.to(dtype).unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(
        comb.to(dtype).transpose(-1, -2), streams
    )
