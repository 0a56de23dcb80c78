"""Sampling the next token from logits: greedy, temperature, top-k, top-p, per-request seeds.

A row that cannot be sampled (torch.multinomial refuses NaN or all-zero probabilities) gives a
RequestError for that request alone instead of a token; the other rows are sampled as usual.
"""

from __future__ import annotations

import torch

from inference.engine.request_errors import RequestError
from inference.engine.sampling_params import SamplingParams


def sample(
    logits: torch.Tensor,  # (N, vocab), already masked by any grammar
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int | RequestError]:
    greedy = logits.argmax(dim=-1).tolist()
    tokens: list[int | RequestError] = []
    for row, (p, generator) in enumerate(zip(params, generators, strict=True)):
        if p.is_greedy:
            tokens.append(greedy[row])
            continue
        try:
            tokens.append(_sample_row(logits[row], p, generator))
        except Exception as exc:  # this row's numbers, not the batch's
            tokens.append(RequestError(f"sampling failed: {type(exc).__name__}: {exc}"))
    return tokens


def _sample_row(logits: torch.Tensor, p: SamplingParams, generator: torch.Generator | None) -> int:
    logits = logits.float() / p.temperature
    if p.top_k > 0 and p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        cumulative = sorted_probs.cumsum(-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = cumulative - sorted_probs > p.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator).item())
