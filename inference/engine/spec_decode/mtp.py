"""Drafts from the model's own multi-token-prediction layer (DeepSeek-V4's `mtp.0`,
models/deepseek_v4/mtp): the runner runs the layer after each step's forward and proposes the
token after the request's next one; the scheduler keeps it on the request (spec_token_ids)
and schedules it the next step. One token per step, as DeepSeek runs it (a larger
num_speculative_tokens changes nothing)."""

from __future__ import annotations

import torch

from inference.engine.request import Request
from inference.engine.request_errors import RequestError
from inference.engine.scheduler_output import Sampled


class MtpDrafter:
    def draft(self, request: Request, max_tokens: int) -> list[int]:
        """The MTP layer's draft made for the request's current length (none after a token
        the grammar forced, or after preemption)."""
        return request.spec_token_ids[:max_tokens]


def mtp_drafts(
    model,
    mtp_state,  # the MTP layer's window state
    context,  # the step's main forward, kept for the layer (DraftContext)
    next_ids: list[int],  # per row of the step: the next token, -1 where sampled this step
    sampling: list[Request],  # the requests sampled this step
    first_rows: list[int],  # each one's first logits row (its last own token's row)
    drafts: list[list[int]],  # each one's draft verified this step
    sampled: dict[str, Sampled],  # the model's tokens per request (ModelRunner.execute)
    device: torch.device,
) -> dict[str, list[int]]:
    """Run the MTP layer over the step's rows, each with its next token: known, or the model's
    token at that row (a verified draft's rows: the greedy token of each, so up to the accepted
    length they are the request's own next tokens). Each greedy request's draft is the layer's
    greedy token at its last accepted row: the token after the one the scheduler appends last
    (spec_decode). A request whose step failed gets none (its rows take any id)."""
    draft_rows, drafted = [], []
    for request, first_row, draft in zip(sampling, first_rows, drafts, strict=True):
        targets = sampled[request.request_id]
        if isinstance(targets, RequestError):
            continue
        targets = targets if isinstance(targets, list) else [targets]
        for index, target in enumerate(targets):
            next_ids[first_row + index] = target
        if request.sampling_params.is_greedy:
            accepted = 0
            while accepted < len(draft) and draft[accepted] == targets[accepted]:
                accepted += 1
            draft_rows.append(first_row + accepted)
            drafted.append(request.request_id)
    logits = model.draft_logits(
        context,
        torch.tensor([max(token, 0) for token in next_ids], device=device),
        mtp_state,
        torch.tensor(draft_rows, dtype=torch.long, device=device),
    )
    tokens = logits.argmax(dim=-1).tolist()
    return {rid: [token] for rid, token in zip(drafted, tokens, strict=True)}
