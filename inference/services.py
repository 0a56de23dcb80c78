"""The one interface the town uses: generate a completion on this process's engine.

Callers (the town's Celery task, running inside a node's worker) pass chat messages and an
optional JSON schema and get back text, token ids and the engine's metrics as a plain dict.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from inference.errors import CompletionInputError
from inference.metrics import metrics_record
from inference.runtime import engine_get

logger = logging.getLogger(__name__)

_ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    num_prompt_tokens: int
    metrics: dict[str, Any]  # dataclasses.asdict(RequestMetrics): seconds and token counts


def _messages_check(messages: object) -> None:
    if not isinstance(messages, list) or not messages:
        raise CompletionInputError(
            'messages must be a non-empty list of {"role": ..., "content": ...} dicts'
        )
    for index, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or message.get("role") not in _ROLES
            or not isinstance(message.get("content"), str)
        ):
            raise CompletionInputError(
                f"messages[{index}] must be a dict with role in {_ROLES} and string content, "
                f"got {message!r}"
            )


def completion_generate(
    *,
    messages: list[dict[str, str]],
    json_schema: dict[str, Any] | None,
    max_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: list[str] | None = None,
    cache_salt: str | None = None,
) -> Completion:
    """Run one chat completion on this process's engine (blocking; safe from many threads).

    With `json_schema`, decoding is constrained to JSON that the schema accepts. Bad input
    raises CompletionInputError with the engine's reason.
    """
    from inference.engine import SamplingParams

    _messages_check(messages)
    if json_schema is not None and not isinstance(json_schema, dict):
        raise CompletionInputError(
            f"json_schema must be a dict (a JSON schema) or None, got {type(json_schema).__name__}"
        )
    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=stop,
            json_schema=json_schema,
            cache_salt=cache_salt,
        )
        (output,) = engine_get().generate([messages], params)
    except ValueError as exc:
        raise CompletionInputError(str(exc)) from exc
    metrics = dataclasses.asdict(output.metrics)
    metrics_record(
        model=settings.INFERENCE_ENGINE["model"],
        metrics=metrics,
        finish_reason=output.finish_reason,
    )
    logger.debug(
        "completion: %s prompt tokens (%s cached), %s output tokens, %.2f s",
        metrics["num_prompt_tokens"],
        metrics["num_cached_tokens"],
        metrics["num_output_tokens"],
        metrics["e2e_s"],
    )
    return Completion(
        text=output.text,
        token_ids=list(output.token_ids),
        finish_reason=output.finish_reason,
        num_prompt_tokens=len(output.prompt_token_ids),
        metrics=metrics,
    )
