"""Speculative decoding: a drafter proposes a decoding request's next tokens; one forward checks
them all; the output is the same tokens as without it (greedy-exact).

The step, as vLLM's v1 spec decode:
- Schedule (Scheduler._draft): a greedy request whose output has begun gets up to k draft tokens
  (never more than its max_tokens / the model length leave room for after the model's own
  token), cut where its grammar refuses one, completes, or forces tokens after one (those are
  appended by jump-forward, never verified). The draft is scheduled after the request's own
  uncomputed tokens in one chunk: `ScheduledRequest.draft_token_ids`, counted in
  num_new_tokens. Blocks are allocated for the draft, but blocks are registered (hashed) only
  for the request's own tokens, so no draft token ever reaches the prefix cache.
- Run (ModelRunner.execute): a logits row at the request's last token and at each draft token;
  row i masked by the grammar as if draft[:i] were accepted; the greedy token of each row.
- Verify (Scheduler._verify): append the model's token of row i while row i-1's draft token
  equals it — the accepted draft tokens, then the model's own token after them (the bonus). An
  accepted draft token's K/V was computed this step and counts as computed; a rejected one's
  slot is simply written again by the next step (K/V, a sliding window's slots and DeepSeek-V4's
  compressed entries are all kept by position). Stop tokens, stop strings, max_tokens and the
  grammar are checked token by token, so a request ends at the same token as without a draft.

Sampled requests (temperature > 0) get no draft: exactness there needs rejection sampling, not
built. Drafters (`Drafter`): prompt lookup (ngram), and a model's own MTP layer (mtp), whose
draft the runner makes after the step's forward (ModelRunner.take_drafts) and the scheduler
keeps on the request for the next step (Request.spec_token_ids).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from inference.engine.request import Request


class Drafter(Protocol):
    def draft(self, request: Request, max_tokens: int) -> list[int]:
        """Up to `max_tokens` tokens the request's output may continue with."""
        ...
