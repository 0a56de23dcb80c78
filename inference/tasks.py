"""Celery tasks of the inference app: one OpenAI-style chat completion, run on the engine of the
node whose queue it was sent to (the web's /v1/chat/completions waits for its result).

At most once: the message is acknowledged when a worker takes it (acks_late off), because a
completion redelivered after a worker died would come back long after its HTTP client gave up.
Bad input is an answer, not a failure: it comes back as {"error": ...} for the web to send as 400.
With a stream key, the text also goes to that Redis stream as it is decoded
(inference/completion_streams.py), ending with the same result or the error.

Deadline: the web gives up after settings.OPENAI_API_TIMEOUT_S, so the completion is aborted in
the engine (its KV blocks freed) once that long has passed since the task started, and the
answer is {"error": ..., "status": 504}. Celery's soft/hard time limits are set a little later
as a backstop, but only a prefork pool enforces them: node workers run `--pool threads`, which
ignores them, so the engine deadline is what ends a completion.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from inference.completion_streams import StreamCancelled, StreamPublisher
from inference.errors import CompletionInputError, CompletionTimeoutError
from inference.services import CompletionRequest, completion_generate

logger = logging.getLogger(__name__)


# Past the engine deadline (OPENAI_API_TIMEOUT_S): for prefork pools only, see above.
SOFT_TIME_LIMIT_S = settings.OPENAI_API_TIMEOUT_S + 30
TIME_LIMIT_S = settings.OPENAI_API_TIMEOUT_S + 60


def _timeout_message(exc: BaseException) -> str:
    return f"the completion ran out of time on the node: {exc}"


@shared_task(
    name="inference.chat_completion",
    acks_late=False,
    soft_time_limit=SOFT_TIME_LIMIT_S,
    time_limit=TIME_LIMIT_S,
)
def chat_completion(request: dict[str, Any], stream_key: str | None = None) -> dict[str, Any]:
    """`request`: a CompletionRequest's JSON (CompletionRequest.to_json). Returns the completion's
    JSON (Completion.to_json), or {"error": why} ({"error": why, "status": 504} when it ran out
    of time); with `stream_key`, streams it there as well."""
    timeout_s = settings.OPENAI_API_TIMEOUT_S
    if stream_key is None:
        try:
            completion = completion_generate(
                request=CompletionRequest.from_json(request), timeout_s=timeout_s
            )
            return completion.to_json()
        except CompletionInputError as exc:
            return {"error": str(exc)}
        except (CompletionTimeoutError, SoftTimeLimitExceeded) as exc:
            return {"error": _timeout_message(exc), "status": 504}
    with StreamPublisher(stream_key) as stream:
        try:
            completion = completion_generate(
                request=CompletionRequest.from_json(request),
                on_text=stream.delta,
                timeout_s=timeout_s,
            )
        except CompletionInputError as exc:
            stream.error(f"the engine refused the request: {exc}", status=400)
            return {"error": str(exc)}
        except (CompletionTimeoutError, SoftTimeLimitExceeded) as exc:
            stream.error(_timeout_message(exc), status=504)
            return {"error": _timeout_message(exc), "status": 504}
        except StreamCancelled as exc:  # the engine request is aborted: nobody reads it
            logger.info("%s; the completion was aborted", exc)
            return {"error": str(exc), "status": 499}
        except Exception as exc:
            stream.error(f"the node failed the completion: {type(exc).__name__}: {exc}", status=500)
            raise
        result = completion.to_json()
        stream.done(result)
        return result
