"""The one interface the town uses: generate a completion on this process's engine, or on an
external OpenAI-compatible server when one is configured (inference/remote.py).

Callers (the town's Celery task, running inside a node's worker) pass chat messages and an
optional JSON schema and get back text, token ids and the metrics as a plain dict, the same
shape whichever backend answered; `on_text` receives the text as it is decoded (streaming).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from inference.errors import CompletionInputError, CompletionTimeoutError
from inference.metrics import metrics_record
from inference.remote import remote_generate, remote_is_configured
from inference.runtime import engine_get

logger = logging.getLogger(__name__)

_ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: list[int]  # empty when an external server answered (it does not send them)
    finish_reason: str  # "stop" | "length"
    num_prompt_tokens: int
    metrics: dict[str, Any]  # dataclasses.asdict(RequestMetrics): seconds and token counts


def completion_model() -> str:
    """The name of the model that answers completions: the external server's when one is
    configured (POKOMACHI_OPENAI_MODEL), else the engine's (POKOMACHI_MODEL)."""
    if remote_is_configured():
        return settings.INFERENCE_OPENAI["model"]
    return settings.INFERENCE_ENGINE["model"]


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
    on_text: Callable[[str], None] | None = None,
    timeout_s: float | None = None,
) -> Completion:
    """Run one chat completion (blocking; safe from many threads) on this process's engine, or
    on the external server of settings.INFERENCE_OPENAI when it has a base_url.

    With `json_schema`, decoding is constrained to JSON that the schema accepts. `on_text` is
    called with each piece of text as it is decoded (no half characters, no part of a stop
    string); the pieces add up to the completion's text. Bad input raises CompletionInputError
    with the backend's reason. Past `timeout_s` (its caller gives up then) the engine aborts the
    request, freeing its KV blocks, and CompletionTimeoutError is raised; so does an exception
    raised by `on_text` (e.g. the stream's reader went away), which then propagates.
    """
    _messages_check(messages)
    if json_schema is not None and not isinstance(json_schema, dict):
        raise CompletionInputError(
            f"json_schema must be a dict (a JSON schema) or None, got {type(json_schema).__name__}"
        )
    request = {
        "messages": messages,
        "json_schema": json_schema,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "seed": seed,
        "stop": stop,
        "cache_salt": cache_salt,
    }
    if remote_is_configured():
        # The server keeps its own metrics (its /metrics); recording here would count twice
        # when it is another Pokomachi on the same Redis.
        text, finish_reason, metrics = remote_generate(on_text=on_text, **request)
        return Completion(
            text=text,
            token_ids=[],
            finish_reason=finish_reason,
            num_prompt_tokens=metrics["num_prompt_tokens"] or 0,
            metrics=metrics,
        )
    return _engine_generate(on_text=on_text, timeout_s=timeout_s, **request)


def _engine_generate(
    *,
    messages: list[dict[str, str]],
    json_schema: dict[str, Any] | None,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    stop: list[str] | None,
    cache_salt: str | None,
    on_text: Callable[[str], None] | None,
    timeout_s: float | None,
) -> Completion:
    from inference.engine import SamplingParams

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
        if on_text is None:
            (output,) = engine_get().generate([messages], params, timeout=timeout_s)
        else:
            # closing: an exception in on_text closes the stream now, which aborts the request.
            stream = engine_get().generate_stream(messages, params, timeout=timeout_s)
            with contextlib.closing(stream):
                for delta in stream:
                    if delta.text:
                        on_text(delta.text)
                    output = delta.output
    except ValueError as exc:
        raise CompletionInputError(str(exc)) from exc
    except TimeoutError as exc:
        raise CompletionTimeoutError(str(exc)) from exc
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


def completion_head_warm(*, messages: list[dict[str, Any]], cache_salt: str | None) -> int:
    """Compute a prompt head (chat messages, rendered without a generation prompt) on this
    process's engine and pin it, so requests starting with it reuse it from the first on;
    returns the pin's handle for `completion_head_unpin`."""
    if remote_is_configured():
        raise CompletionInputError(
            "an external OpenAI-compatible server answers completions here: it keeps its own "
            "cache, and heads cannot be warmed from this side"
        )
    _messages_check(messages)
    try:
        return engine_get().warm(messages, pin=True, cache_salt=cache_salt).handle
    except ValueError as exc:
        raise CompletionInputError(str(exc)) from exc


def completion_head_unpin(*, handle: int) -> None:
    """Let a warmed head be evicted again."""
    try:
        engine_get().unpin(handle)
    except ValueError as exc:
        raise CompletionInputError(str(exc)) from exc
