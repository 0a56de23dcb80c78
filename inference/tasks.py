"""Celery tasks of the inference app: one OpenAI-style chat completion, run on the engine of the
node whose queue it was sent to (the web's /v1/chat/completions waits for its result).

At most once: the message is acknowledged when a worker takes it (acks_late off), because a
completion redelivered after a worker died would come back long after its HTTP client gave up.
Bad input is an answer, not a failure: it comes back as {"error": ...} for the web to send as 400.
With a stream key, the text also goes to that Redis stream as it is decoded
(inference/completion_streams.py), ending with the same result or the error.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from inference.completion_streams import StreamPublisher
from inference.errors import CompletionInputError
from inference.services import Completion, completion_generate

logger = logging.getLogger(__name__)


def _result(completion: Completion) -> dict[str, Any]:
    return {
        "text": completion.text,
        "token_ids": completion.token_ids,
        "finish_reason": completion.finish_reason,
        "num_prompt_tokens": completion.num_prompt_tokens,
        "metrics": completion.metrics,
    }


@shared_task(name="inference.chat_completion", acks_late=False)
def chat_completion(request: dict[str, Any], stream_key: str | None = None) -> dict[str, Any]:
    """`request`: completion_generate's keyword arguments (plain JSON). Returns the completion
    as a dict, or {"error": why}; with `stream_key`, streams it there as well."""
    if stream_key is None:
        try:
            return _result(completion_generate(**request))
        except CompletionInputError as exc:
            return {"error": str(exc)}
    with StreamPublisher(stream_key) as stream:
        try:
            result = _result(completion_generate(**request, on_text=stream.delta))
        except CompletionInputError as exc:
            stream.error(f"the engine refused the request: {exc}", status=400)
            return {"error": str(exc)}
        except Exception as exc:
            stream.error(f"the node failed the completion: {type(exc).__name__}: {exc}", status=500)
            raise
        stream.done(result)
        return result
