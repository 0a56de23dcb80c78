"""Completions on this process's engine, or on an external OpenAI-compatible server when one is
configured (inference/completions/remote.py): generate one, warm and pin prompt heads, compile
schemas ahead, count tokens, and build an engine afresh for a block of work. The town reaches
these through its door, inference/services.py.

Callers pass a CompletionRequest (chat messages, an optional JSON schema, sampling parameters,
an affinity key) and get back a Completion: text, token ids and CompletionMetrics, the same
types whichever backend answered (inference/completions/types.py); `on_text` receives the text
as it is decoded (streaming). What a node served is recorded for its heartbeat
(inference/fleet/prefixes.py), so the fleet's router sends the next request that shares a
prefix to it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any

from django.conf import settings

from inference.completions.metrics import metrics_record
from inference.completions.remote import remote_generate, remote_is_configured
from inference.completions.runtime import (
    EngineProfile,
    engine_configured,
    engine_get,
    engine_num_text_tokens,
    engine_profile,
    engine_prompt_token_ids,
    engine_settings,
)
from inference.completions.types import (
    Completion,
    CompletionMetrics,
    CompletionRequest,
    messages_check,
)
from inference.errors import CompletionInputError, CompletionTimeoutError
from inference.fleet.prefixes import prompt_prefixes, served_prefixes

logger = logging.getLogger(__name__)


def completion_model() -> str:
    """The name of the model that answers completions: the external server's when one is
    configured (POKOMACHI_OPENAI_MODEL), else the engine's (POKOMACHI_MODEL)."""
    if remote_is_configured():
        return settings.INFERENCE_OPENAI["model"]
    return engine_settings()["model"]


def completion_retention_interval() -> int | None:
    """The retention interval this process's engine is built with (the nodes' engines use the
    same: env POKOMACHI_RETENTION_INTERVAL); None, the window kept at every block."""
    return engine_settings().get("retention_interval")


def completion_generate(
    *,
    request: CompletionRequest,
    on_text: Callable[[str], None] | None = None,
    timeout_s: float | None = None,
) -> Completion:
    """Run one chat completion (blocking; safe from many threads) on this process's engine, or
    on the external server of settings.INFERENCE_OPENAI when it has a base_url.

    With `request.json_schema`, decoding is constrained to JSON that the schema accepts.
    `on_text` is called with each piece of text as it is decoded (no half characters, no part of
    a stop string); the pieces add up to the completion's text. Bad input raises
    CompletionInputError with the backend's reason. Past `timeout_s` (its caller gives up then)
    the engine aborts the request, freeing its KV blocks, and CompletionTimeoutError is raised;
    so does an exception raised by `on_text` (e.g. the stream's reader went away), which then
    propagates.
    """
    if remote_is_configured():
        # The server keeps its own metrics (its /metrics); recording here would count twice
        # when it is another Pokomachi on the same Redis.
        return remote_generate(request=request, on_text=on_text)
    return _engine_generate(request=request, on_text=on_text, timeout_s=timeout_s)


def _engine_generate(
    *,
    request: CompletionRequest,
    on_text: Callable[[str], None] | None,
    timeout_s: float | None,
) -> Completion:
    from inference.engine import SamplingParams

    messages = request.messages
    try:
        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop=request.stop,
            json_schema=request.json_schema,
            cache_salt=request.cache_salt,
        )
        if on_text is None:
            (output,) = engine_get().generate(
                [messages], params, timeout=timeout_s, priority=request.priority
            )
        else:
            # closing: an exception in on_text closes the stream now, which aborts the request.
            stream = engine_get().generate_stream(
                messages, params, timeout=timeout_s, priority=request.priority
            )
            with contextlib.closing(stream):
                for delta in stream:
                    if delta.text:
                        on_text(delta.text)
                    output = delta.output
    except ValueError as exc:
        raise CompletionInputError(str(exc)) from exc
    except TimeoutError as exc:
        raise CompletionTimeoutError(str(exc)) from exc
    # What this node now holds, for its heartbeat (inference/fleet/prefixes.py says how
    # approximate).
    served_prefixes().record(prompt_prefixes(request.messages, request.cache_salt))
    metrics = CompletionMetrics.from_request_metrics(output.metrics)
    metrics_record(
        model=engine_settings()["model"],
        metrics=metrics,
        finish_reason=output.finish_reason,
    )
    logger.debug(
        "completion: %s prompt tokens (%s cached), %s output tokens, %.2f s",
        metrics.num_prompt_tokens,
        metrics.num_cached_tokens,
        metrics.num_output_tokens,
        metrics.e2e_s,
    )
    return Completion(
        text=output.text,
        token_ids=list(output.token_ids),
        finish_reason=output.finish_reason,
        num_prompt_tokens=len(output.prompt_token_ids),
        metrics=metrics,
    )


def completion_schemas_warm(*, json_schemas: list[dict[str, Any]]) -> list[str | None]:
    """Compile JSON schemas on this process's engine now and wait for them (each distinct one
    once; at most the engine's compile workers at once), so completions that use them later
    start at once; per schema, None or why it was refused. With an external server configured
    nothing is compiled here (it compiles its own) and every entry is None."""
    return completion_schemas_warm_start(json_schemas=json_schemas).result()


def completion_schemas_warm_start(
    *, json_schemas: list[dict[str, Any]]
) -> Future[list[str | None]]:
    """As completion_schemas_warm, but returning at once: the compiles run on the engine's
    compile threads, and the future (what completion_schemas_warm answers) is done when they
    all are."""
    warmed: Future[list[str | None]] = Future()
    if remote_is_configured() or not json_schemas:
        warmed.set_result([None] * len(json_schemas))
        return warmed
    engine = engine_get()
    futures = [engine.compile_schema_async(schema)[0] for schema in json_schemas]
    lock = threading.Lock()  # the last two compiles may end at once, on two threads

    def all_done(_: Future) -> None:
        with lock:
            if warmed.done() or not all(future.done() for future in futures):
                return
            try:
                result = [future.result().error for future in futures]
            except Exception as exc:  # not a schema's fault: the engine shut down
                warmed.set_exception(exc)
                return
            warmed.set_result(result)

    for future in futures:
        future.add_done_callback(all_done)
    return warmed


def completion_head_warm(*, messages: list[dict[str, Any]], cache_salt: str | None) -> int:
    """Compute a prompt head (chat messages, rendered without a generation prompt) on this
    process's engine and pin it, so requests starting with it reuse it from the first on;
    returns the pin's handle for `completion_head_unpin`."""
    if remote_is_configured():
        raise CompletionInputError(
            "an external OpenAI-compatible server answers completions here: it keeps its own "
            "cache, and heads cannot be warmed from this side"
        )
    messages_check(messages)
    try:
        handle = engine_get().warm(messages, pin=True, cache_salt=cache_salt).handle
    except ValueError as exc:
        raise CompletionInputError(str(exc)) from exc
    served_prefixes().record(prompt_prefixes(messages, cache_salt))
    return handle


def completion_head_unpin(*, handle: int) -> None:
    """Let a warmed head be evicted again."""
    try:
        engine_get().unpin(handle)
    except ValueError as exc:
        raise CompletionInputError(str(exc)) from exc


@contextlib.contextmanager
def completion_engine_configured(*, overrides: Mapping[str, Any]) -> Iterator[EngineProfile]:
    """Completions of this process, for the duration of the block, on an engine built afresh
    with `overrides` (EngineConfig arguments) on top of the deployment's, its caches empty
    (inference/completions/runtime.py: engine_configured); yields its profile. Meanwhile
    completion_model, completion_retention_interval and the token counts below answer for it."""
    with engine_configured(**overrides):
        yield engine_profile()


def completion_prompt_token_ids(*, messages: list[dict[str, Any]]) -> list[int]:
    """A chat prompt's token ids (with the generation prompt), by this process's engine."""
    return engine_prompt_token_ids(messages)


def completion_num_text_tokens(*, text: str) -> int:
    """How many tokens this process's engine makes of plain `text`."""
    return engine_num_text_tokens(text)
