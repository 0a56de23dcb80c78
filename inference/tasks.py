"""Celery tasks of the inference app: one OpenAI-style chat completion, run on the engine of the
node whose queue it was sent to (the web's /v1/chat/completions waits for its result).

At most once: the message is acknowledged when a worker takes it (acks_late off), because a
completion redelivered after a worker died would come back long after its HTTP client gave up.
Bad input is an answer, not a failure: it comes back as {"error": ...} for the web to send as 400.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from inference.errors import CompletionInputError
from inference.runtime import engine_get
from inference.services import completion_generate

logger = logging.getLogger(__name__)


def _text_pieces(token_ids: list[int], text: str) -> list[str]:
    """The text each output token adds, for streaming; one piece if they do not add up to `text`
    (a stop string cut the text mid-token)."""
    tokenizer = engine_get().tokenizer
    pieces, previous = [], ""
    for end in range(1, len(token_ids) + 1):
        decoded = tokenizer.decode(token_ids[:end])
        if decoded.startswith(previous) and not decoded.endswith("\ufffd"):
            pieces.append(decoded[len(previous) :])
            previous = decoded
    if previous != text:
        return [text] if text else []
    return [p for p in pieces if p]


@shared_task(name="inference.chat_completion", acks_late=False)
def chat_completion(request: dict[str, Any], with_pieces: bool = False) -> dict[str, Any]:
    """`request`: completion_generate's keyword arguments (plain JSON). Returns the completion
    as a dict, with `pieces` (text per token) when asked for, or {"error": why}."""
    try:
        completion = completion_generate(**request)
    except CompletionInputError as exc:
        return {"error": str(exc)}
    result = {
        "text": completion.text,
        "token_ids": completion.token_ids,
        "finish_reason": completion.finish_reason,
        "num_prompt_tokens": completion.num_prompt_tokens,
        "metrics": completion.metrics,
    }
    if with_pieces:
        result["pieces"] = _text_pieces(completion.token_ids, completion.text)
    return result
