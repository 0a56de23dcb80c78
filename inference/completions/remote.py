"""Completions from an external OpenAI-compatible server (vLLM, SGLang, or another Pokomachi's
/v1) instead of this process's engine: used by `completion_generate` when
settings.INFERENCE_OPENAI["base_url"] is set (env POKOMACHI_OPENAI_BASE_URL).

The request streams (`stream_options.include_usage`), so the time to first token is measured
here, as the client sees it (network included): client_ttft_s, client_e2e_s. The server's
`usage` gives prompt, output and cached tokens (`prompt_tokens_details`; vLLM sends it with
`--enable-prompt-tokens-details`). A server that reports its own per-request timings, as our
/v1 does in a `metrics` field beside the usage, is believed for queue / prefill / decode / TTFT /
e2e; otherwise ttft_s, e2e_s and decode_s (= e2e − ttft) are the client's, and queue_s and
prefill_s stay None (vLLM has them only in aggregate, in its own /metrics). A server that sends
no `cached_tokens` (llama-cpp-python's) leaves num_cached_tokens unknown (None), not 0.

A JSON schema goes in the server's own dialect (remote_dialects.py: OpenAI's json_schema,
llama-cpp-python's json_object + schema, vLLM's guided_json, or none with a check and a bounded
retry), learned on the first structured request and remembered per server.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import jsonschema
from django.conf import settings

from inference.completions.remote_dialects import (
    DIALECTS,
    MAX_ANSWER_TRIES,
    NOT_A_DIALECT_STATUS,
    dialect_apply,
    dialect_memory,
)
from inference.completions.types import Completion, CompletionMetrics, CompletionRequest
from inference.errors import CompletionInputError, InferenceError

logger = logging.getLogger(__name__)


class RemoteServerError(InferenceError):
    """The external server did not answer, or answered with a server error."""


def remote_is_configured() -> bool:
    return bool(settings.INFERENCE_OPENAI.get("base_url"))


def remote_model() -> str:
    return settings.INFERENCE_OPENAI["model"]


def _client():
    import openai

    config = settings.INFERENCE_OPENAI
    return openai.OpenAI(
        base_url=config["base_url"],
        api_key=config.get("api_key") or "unused",
        timeout=settings.OPENAI_API_TIMEOUT_S,
        max_retries=0,  # the Celery task retries a decision; a silent retry would skew timings
    )


def _request(request: CompletionRequest) -> dict[str, Any]:
    """The create() keywords, without the JSON schema (remote_dialects adds it)."""
    body: dict[str, Any] = {
        "model": remote_model(),
        # Only what OpenAI defines: the town's cache breakpoints ("cache": True) are ours.
        "messages": [{"role": m["role"], "content": m["content"]} for m in request.messages],
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.seed is not None:
        body["seed"] = request.seed
    if request.stop:
        body["stop"] = request.stop
    if request.cache_salt is not None:
        body["extra_body"] = {"cache_salt": request.cache_salt}  # vLLM's prefix-cache isolation key
    return body


def remote_generate(
    *, request: CompletionRequest, on_text: Callable[[str], None] | None = None
) -> Completion:
    """The completion from the external server (no token ids: it does not send them);
    CompletionInputError if it refused the request (HTTP 4xx). With a JSON schema, in the
    server's dialect (remote_dialects), learned on its first such request."""
    import openai

    base_url = settings.INFERENCE_OPENAI["base_url"]
    body = _request(request)
    if request.json_schema is None:
        try:
            return _stream(body, on_text)
        except openai.APIError as exc:
            raise _error(exc, base_url) from exc
    memory = dialect_memory()
    is_known = memory.get(base_url) is not None
    refusals: list[openai.APIError] = []
    for dialect in memory.candidates(base_url):
        try:
            completion = _checked(body, request, on_text, base_url, dialect)
        except openai.APIError as exc:
            status = getattr(exc, "status_code", None)
            if is_known or status in NOT_A_DIALECT_STATUS or _is_connection(exc):
                raise _error(exc, base_url) from exc
            logger.info(
                "%s refused structured output as %s (%s: %s); trying the next dialect",
                base_url,
                dialect,
                status or "error event",
                _one_line(exc.message)[:200],
            )
            refusals.append(exc)
            continue
        memory.learn(base_url, dialect)
        return completion
    error = _error(refusals[0], base_url)
    raise type(error)(f"{error} (refused in every structured-output dialect: {DIALECTS})")


def _checked(
    body: dict[str, Any],
    request: CompletionRequest,
    on_text: Callable[[str], None] | None,
    base_url: str,
    dialect: str,
) -> Completion:
    """Ask in `dialect`, check the answer against the schema, ask again (a new seed) up to
    MAX_ANSWER_TRIES times; the text goes to `on_text` once checked. Without a constraint the
    model may stray; with one, a server may still end an answer early: llama-cpp-python's
    server cuts a stream short, empty, when another request arrives (its --interrupt_requests,
    on by default). A refusal (the openai client's error) propagates at once."""
    completion = None
    label = "no constraint" if dialect == "unconstrained" else dialect
    for attempt in range(MAX_ANSWER_TRIES):
        if request.seed is not None:
            body = {**body, "seed": request.seed + attempt}
        asked = (
            body
            if dialect == "unconstrained"
            else dialect_apply(body, dialect, request.json_schema)
        )
        completion = _stream(asked, None)
        problem = _schema_problem(completion.text, request.json_schema)
        if problem is None:
            break
        logger.info(
            "%s (%s): answer %s of %s is outside the schema (%s)",
            base_url,
            label,
            attempt + 1,
            MAX_ANSWER_TRIES,
            problem,
        )
    else:
        logger.warning(
            "%s (%s): none of %s answers followed the schema; keeping the last",
            base_url,
            label,
            MAX_ANSWER_TRIES,
        )
    if on_text is not None and completion.text:
        on_text(completion.text)
    return completion


def _schema_problem(text: str, schema: dict[str, Any]) -> str | None:
    try:
        jsonschema.validate(json.loads(text), schema)
    except json.JSONDecodeError as exc:
        return f"not JSON: {exc}"
    except jsonschema.ValidationError as exc:
        return exc.message
    return None


def _stream(body: dict[str, Any], on_text: Callable[[str], None] | None) -> Completion:
    """One streamed request; the openai client's errors propagate."""
    started = time.monotonic()
    first_token_at: float | None = None
    pieces: list[str] = []
    finish_reason, usage, server_metrics = "stop", None, {}
    stream = _client().chat.completions.create(**body)
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            server_metrics = (chunk.model_extra or {}).get("metrics") or {}
        for choice in chunk.choices:
            text = choice.delta.content or ""
            if text:
                first_token_at = first_token_at or time.monotonic()
                pieces.append(text)
                if on_text is not None:
                    on_text(text)
            if choice.finish_reason:
                finish_reason = choice.finish_reason
    ended = time.monotonic()
    first = first_token_at or ended
    client = {"ttft_s": first - started, "e2e_s": ended - started, "decode_s": ended - first}
    metrics = _metrics(usage, server_metrics, client)
    return Completion(
        text="".join(pieces),
        token_ids=[],
        finish_reason=finish_reason,
        num_prompt_tokens=metrics.num_prompt_tokens or 0,
        metrics=metrics,
    )


def _is_connection(exc: Exception) -> bool:
    import openai

    return isinstance(exc, openai.APIConnectionError)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _error(exc: Exception, base_url: str) -> InferenceError:
    """The openai client's error as ours: a refusal (4xx, or an invalid-request error event) is
    the caller's CompletionInputError; the rest RemoteServerError."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        if 400 <= exc.status_code < 500:
            return CompletionInputError(f"{base_url} refused the request: {exc.message}")
        return RemoteServerError(f"{base_url} failed the request: {exc.message}")
    if isinstance(exc, openai.APIConnectionError):
        return RemoteServerError(f"no answer from {base_url}: {exc}")
    if isinstance(exc, openai.APIError) and exc.type == "invalid_request_error":
        return CompletionInputError(f"{base_url} refused the request: {exc.message}")
    return RemoteServerError(f"{base_url} failed the request: {exc}")


def _metrics(usage: Any, server: dict[str, Any], client: dict[str, float]) -> CompletionMetrics:
    """The server's usage for token counts; its own timings where it sends them (our /v1's
    `metrics`), else the client's."""

    def timing(name: str) -> float | None:
        value = server.get(name)
        return value if isinstance(value, int | float) else client.get(name)

    if usage is None:
        logger.warning("the OpenAI-compatible server sent no usage: token counts unknown")
        num_prompt = num_cached = num_output = None
    else:
        details = usage.prompt_tokens_details
        num_prompt, num_output = usage.prompt_tokens, usage.completion_tokens
        num_cached = details.cached_tokens if details is not None else None
    return CompletionMetrics(
        queue_s=timing("queue_s"),
        prefill_s=timing("prefill_s"),
        decode_s=timing("decode_s"),
        ttft_s=timing("ttft_s"),
        e2e_s=timing("e2e_s"),
        num_prompt_tokens=num_prompt,
        num_cached_tokens=num_cached,
        num_output_tokens=num_output,
        num_preemptions=0,
        backend=f"openai:{settings.INFERENCE_OPENAI['base_url']}",
        client_ttft_s=client["ttft_s"],
        client_e2e_s=client["e2e_s"],
    )
