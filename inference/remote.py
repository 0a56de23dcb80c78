"""Completions from an external OpenAI-compatible server (vLLM, SGLang, or another Pokomachi's
/v1) instead of this process's engine: used by `completion_generate` when
settings.INFERENCE_OPENAI["base_url"] is set (env POKOMACHI_OPENAI_BASE_URL).

The request streams (`stream_options.include_usage`), so the time to first token is measured
here, as the client sees it (network included): client_ttft_s, client_e2e_s. The server's
`usage` gives prompt, output and cached tokens (`prompt_tokens_details`; vLLM sends it with
`--enable-prompt-tokens-details`). A server that reports its own per-request timings, as our
/v1 does in a `metrics` field beside the usage, is believed for queue / prefill / decode / TTFT /
e2e; otherwise ttft_s, e2e_s and decode_s (= e2e − ttft) are the client's, and queue_s and
prefill_s stay None (vLLM has them only in aggregate, in its own /metrics).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings

from inference.completion import Completion, CompletionMetrics, CompletionRequest
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
    if request.json_schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "decision", "schema": request.json_schema},
        }
    if request.cache_salt is not None:
        body["extra_body"] = {"cache_salt": request.cache_salt}  # vLLM's prefix-cache isolation key
    return body


def remote_generate(
    *, request: CompletionRequest, on_text: Callable[[str], None] | None = None
) -> Completion:
    """The completion from the external server (no token ids: it does not send them);
    CompletionInputError if it refused the request (HTTP 4xx)."""
    import openai

    base_url = settings.INFERENCE_OPENAI["base_url"]
    started = time.monotonic()
    first_token_at: float | None = None
    pieces: list[str] = []
    finish_reason, usage, server_metrics = "stop", None, {}
    try:
        stream = _client().chat.completions.create(**_request(request))
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
    except openai.APIStatusError as exc:
        if 400 <= exc.status_code < 500:
            raise CompletionInputError(f"{base_url} refused the request: {exc.message}") from exc
        raise RemoteServerError(f"{base_url} failed the request: {exc.message}") from exc
    except openai.APIConnectionError as exc:
        raise RemoteServerError(f"no answer from {base_url}: {exc}") from exc
    except openai.APIError as exc:  # an error event inside the stream
        if exc.type == "invalid_request_error":
            raise CompletionInputError(f"{base_url} refused the request: {exc.message}") from exc
        raise RemoteServerError(f"{base_url} failed the request: {exc.message}") from exc
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
