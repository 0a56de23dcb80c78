"""What a prompt reused from the prefix cache, and where the rest went.

Every prompt token lands in exactly one bucket, so the buckets add up to the prompt length:

    reused | lost to retention | lost to alignment | lost to eviction | cold

Walking the prompt from the start, with R the reuse point:
- [R, H): the full-attention chain hit these blocks (H: the chain's end, capped so that the last
  prompt token is recomputed), but there was no window checkpoint at or after the point to
  resume from — retention; or a checkpoint had been kept there and was evicted since (up to
  the last such checkpoint Q) — eviction.
- [H, M): tokens that match a cached prompt but not a whole shared block: the partial last
  block (and the block recomputed for the last token's logits) — alignment.
- [M, E): blocks that were cached and evicted since — eviction.
- [E, end): never in a cached block — cold. Only full blocks are cached, so the unfilled last
  block of an earlier prompt never was: tokens matching it are cold too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefixReuse:
    num_prompt_tokens: int
    num_reused_tokens: int = 0
    num_lost_to_retention: int = 0
    num_lost_to_alignment: int = 0
    num_lost_to_eviction: int = 0
    num_cold_tokens: int = 0
    # What the reuse point came from: none | block_chain | breakpoint | junction | pinned |
    # replay (DeepSeek's bounded replay: approximate)
    source: str = "none"
    # Bounded replay: of the tokens lost to retention, those recomputed over the cached
    # compressed state with their window truncated (approximate), not from scratch.
    num_replayed_tokens: int = 0

    @classmethod
    def cold(cls, num_prompt_tokens: int) -> PrefixReuse:
        return cls(num_prompt_tokens, num_cold_tokens=num_prompt_tokens)

    @classmethod
    def from_positions(
        cls,
        num_prompt_tokens: int,
        *,
        reused: int,
        checkpoint_evicted_upto: int,
        reusable: int,
        matched: int,
        evicted_upto: int,
        source: str = "none",
        num_replayed_tokens: int = 0,
    ) -> PrefixReuse:
        """Positions R ≤ Q ≤ H ≤ M ≤ E ≤ prompt length, as in the module docstring."""
        r, q, h, m, e = reused, checkpoint_evicted_upto, reusable, matched, evicted_upto
        assert 0 <= r <= q <= h <= m <= e <= num_prompt_tokens, (r, q, h, m, e, num_prompt_tokens)
        return cls(
            num_prompt_tokens,
            num_reused_tokens=r,
            num_lost_to_retention=h - q,
            num_lost_to_alignment=m - h,
            num_lost_to_eviction=(q - r) + (e - m),
            num_cold_tokens=num_prompt_tokens - e,
            source=source,
            num_replayed_tokens=num_replayed_tokens,
        )
