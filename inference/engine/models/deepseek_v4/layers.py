"""DeepSeek-V4's small pieces: RMS norms and its rotary embedding (interleaved pairs on the
trailing rope_dim channels, YaRN on the compressed branches)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.models.deepseek_v4.config import DeepseekV4Config
from inference.engine.models.deepseek_v4.norms_cpu import compiled_rms_norm, runs_compiled


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """In fp32, then x's dtype: on the CPU one compiled loop (norms_cpu), elsewhere torch's
        fused rms_norm, one op where the steps were seven (a decode step of the tiny V4 is
        hundreds of such small ops)."""
        if runs_compiled(x, self.weight):
            return compiled_rms_norm(x, self.weight, self.eps)
        h = F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps)
        return h.to(x.dtype)


def unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    if runs_compiled(x, None):  # as RMSNorm's
        return compiled_rms_norm(x, None, eps)
    if x.dtype == torch.float32:  # fused, as RMSNorm's
        return F.rms_norm(x, (x.shape[-1],), eps=eps)
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)


# ---- rotary: interleaved pairs on the trailing rope_dim channels ------------------------------


def rope_inv_freq(config: DeepseekV4Config, theta: float, yarn: dict | None) -> torch.Tensor:
    """One frequency per channel pair; YaRN blends interpolated and extrapolated ones."""
    dim = config.rope_dim
    # On the CPU whatever the default device: see llama.RotaryEmbedding.
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float, device="cpu") / dim)
    if yarn is None:
        return 1.0 / pos_freqs
    factor = float(yarn["factor"])
    original = int(yarn["original_max_position_embeddings"])
    beta_fast, beta_slow = yarn.get("beta_fast") or 32, yarn.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.arange(dim // 2, dtype=torch.float, device="cpu")
    ramp = ((ramp - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


@dataclass(frozen=True, slots=True)
class Rope:
    """A rotary table at some positions: cos and sin (..., 1, rope_dim), each pair's angle
    repeated for both its channels (what the kernels read), and cis (..., 1, rope_dim / 2), each
    pair's cos + i·sin (what apply_rope multiplies by), built once a step for every layer."""

    cos: torch.Tensor
    sin: torch.Tensor
    cis: torch.Tensor

    def inverse(self) -> Rope:
        """The rotation back (K = V carried RoPE into attention's output)."""
        return Rope(self.cos, -self.sin, self.cis.conj())

    def at(self, rows: slice) -> Rope:
        return Rope(self.cos[rows], self.sin[rows], self.cis[rows])


class Rotary(nn.Module):
    def __init__(self, inv_freq: torch.Tensor, scaling: float = 1.0) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.scaling = scaling

    def forward(self, positions: torch.Tensor) -> Rope:
        freqs = positions[:, None].float() * self.inv_freq[None, :]  # (T, rope_dim / 2)
        cos, sin = freqs.cos() * self.scaling, freqs.sin() * self.scaling
        return Rope(
            cos.repeat_interleave(2, dim=-1)[:, None, :],
            sin.repeat_interleave(2, dim=-1)[:, None, :],
            torch.complex(cos, sin)[:, None, :],
        )


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x: (T, heads, head_dim); rotates its last rope_dim channels pairwise, in fp32: each pair
    (a, b) as the complex a + ib times cos + i·sin, in place on an fp32 copy of x (4x faster
    at decode sizes than building the rotated pairs and concatenating)."""
    rope_dim = 2 * rope.cis.shape[-1]
    out = x.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    torch.view_as_complex(out[..., -rope_dim:].unflatten(-1, (-1, 2))).mul_(rope.cis)
    return out.to(x.dtype)


@dataclass(frozen=True, slots=True)
class Ropes:
    """A step's rotary tables at its positions for both rope kinds (sliding layers use "main",
    compressor layers "compress"), and the compress rotary for entries' own positions."""

    main: Rope
    compress: Rope
    compress_rotary: Rotary
