"""Drafts from the model's own multi-token-prediction layer (DeepSeek-V4's `mtp.0`,
models/deepseek_v4/mtp): the runner runs the layer after each step's forward and proposes the
token after the request's next one; the scheduler keeps it on the request (spec_token_ids)
and schedules it the next step. One token per step, as DeepSeek runs it."""

from __future__ import annotations

from inference.engine.core.request import Request


class MtpDrafter:
    def draft(self, request: Request, max_tokens: int) -> list[int]:
        """The MTP layer's draft made for the request's current length (none after a token
        the grammar forced, or after preemption)."""
        return request.spec_token_ids[:max_tokens]
