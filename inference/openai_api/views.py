"""`POST /v1/chat/completions` and `GET /v1/models`, served by the web process and executed on
a node through Celery (`inference.chat_completion`, inference/tasks.py).

The views are async so that waiting for a node never holds a server thread. A plain request
polls the task's result from the result backend. A streamed one reads the Redis stream the
worker writes as it decodes (inference/completions/streams.py): the role chunk at once, SSE
keep-alive comments while the request waits or prefills, a chunk per piece of text as it is
decoded, then the finish reason and the usage (with our `metrics` beside it). If the node never
starts or its worker dies mid-way, the stream ends with an error event in OpenAI's shape.

A client that leaves is told to the worker, which aborts the completion (its KV blocks freed):
for a stream when the server closes its generator, for a plain request when Django cancels the
view on the client's disconnect (both set the completion's cancel key,
inference/completions/streams.py). Each caller has a bounded number of completions in flight
(in_flight.py): one more is a 429; and a bounded share of each node's schema compiles
(inference/completions/schema_compiles.py): a request past it is a 429 from the node, with its
Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from inference.completions.cache_salt import request_identity, v1_cache_salt
from inference.completions.streams import (
    StreamTimeout,
    completion_stream_key,
    stream_cancel,
    stream_events,
)
from inference.completions.types import Completion
from inference.errors import UnknownNodeError
from inference.fleet.nodes import node_default, node_queue
from inference.fleet.task_queue import TaskQueueUnavailable, task_send
from inference.openai_api.guards import api_key_required, same_site_json
from inference.openai_api.in_flight import (
    ANONYMOUS,
    InFlightSlot,
    in_flight_acquire,
    in_flight_release,
)
from inference.openai_api.protocol import (
    ChatRequest,
    OpenAIError,
    RateLimitError,
    body_parse,
    chat_completion_body,
    chat_request_parse,
    chunk,
    completion_id,
    usage,
)
from inference.services import completion_model

POLL_S = 0.05
KEEPALIVE_S = 5.0


def _served_model() -> str:
    return completion_model()


def _error(exc: OpenAIError) -> JsonResponse:
    response = JsonResponse(exc.body(), status=exc.status)
    if isinstance(exc, RateLimitError):
        response["Retry-After"] = str(exc.retry_after_s)
    return response


def _send(
    request: ChatRequest,
    *,
    stream_key: str | None,
    identity: str | None,
    cancel_key: str | None = None,
) -> tuple[str, Any]:
    from inference.tasks import chat_completion

    try:
        node = request.node or node_default()
        queue = node_queue(node)
    except UnknownNodeError as exc:
        raise OpenAIError(str(exc), param="node") from exc
    timeout_s = settings.OPENAI_API_TIMEOUT_S
    # The node counts its schema compiles against this caller's share
    # (inference/completions/schema_compiles.py).
    kwargs = {"identity": identity or ANONYMOUS}
    if cancel_key is not None:
        kwargs["cancel_key"] = cancel_key
    # expires: a node that comes up after the client gave up drops the request.
    try:
        result = task_send(
            chat_completion,
            args=[request.completion_request.to_json(), stream_key],
            kwargs=kwargs,
            queue=queue,
            expires=timeout_s,
        )
    except TaskQueueUnavailable as exc:
        raise OpenAIError(str(exc), status=503, type_="server_error", code="queue_down") from exc
    return node, result


def _result_meta(result: Any) -> dict[str, Any]:
    return result.backend.get_task_meta(result.id)


async def _wait(node: str, result: Any, *, deadline: float) -> Completion | None:
    """The task's answer; None while it is not there yet and `deadline` has not passed."""
    meta = await sync_to_async(_result_meta, thread_sensitive=False)(result)
    state = meta.get("status")
    if state == "SUCCESS":
        answer = meta["result"]
        if "error" in answer:  # bad input (400), past a share (429), out of time (504)
            if answer.get("status") == 504:
                raise OpenAIError(answer["error"], status=504, type_="timeout")
            if answer.get("status") == 429:
                raise RateLimitError(
                    answer["error"],
                    retry_after_s=answer["retry_after_s"],
                    code="too_many_schema_compiles",
                )
            raise OpenAIError(f"the engine refused the request: {answer['error']}")
        return Completion.from_json(answer)
    if state in ("FAILURE", "REVOKED"):
        raise OpenAIError(
            f"node {node!r} failed the completion: {meta.get('result')!r}",
            status=500,
            type_="server_error",
        )
    if time.monotonic() > deadline:
        raise OpenAIError(
            f"no answer from node {node!r} within {settings.OPENAI_API_TIMEOUT_S:g} s: is its "
            f"worker running (celery -A pokosite worker -Q {node} --pool threads)?",
            status=504,
            type_="timeout",
        )
    return None


async def _answer(node: str, result: Any, cancel_key: str) -> Completion:
    deadline = time.monotonic() + settings.OPENAI_API_TIMEOUT_S
    try:
        while (answer := await _wait(node, result, deadline=deadline)) is None:
            await asyncio.sleep(POLL_S)
    except asyncio.CancelledError:  # the client disconnected: Django cancels the view
        await sync_to_async(stream_cancel, thread_sensitive=False)(cancel_key)
        raise
    return answer


async def _events_until_left(id_: str, node: str) -> AsyncIterator[Any]:
    """The stream's events; when the client leaves before the end (the server closes this
    generator), the worker is told to stop, so the engine aborts the request."""
    key = completion_stream_key(id_)
    ended = False
    try:
        async for event in stream_events(key, node=node):
            ended = event.kind in ("done", "error")
            yield event
    finally:
        if not ended:
            stream_cancel(key)


def _sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _stream(
    request: ChatRequest, node: str, id_: str, slot: InFlightSlot | None = None
) -> AsyncIterator[str]:
    try:
        async for part in _stream_parts(request, node, id_):
            yield part
    finally:
        await in_flight_release(slot)


async def _stream_parts(request: ChatRequest, node: str, id_: str) -> AsyncIterator[str]:
    created, model = int(time.time()), request.model
    yield _sse(
        chunk(id_=id_, model=model, created=created, delta={"role": "assistant", "content": ""})
    )
    last_sent = time.monotonic()
    completion: Completion | None = None
    try:
        async with contextlib.aclosing(_events_until_left(id_, node)) as events:
            async for event in events:
                if event.kind == "delta":
                    delta = {"content": event.data["text"]}
                    yield _sse(chunk(id_=id_, model=model, created=created, delta=delta))
                    last_sent = time.monotonic()
                elif event.kind == "idle" and time.monotonic() - last_sent > KEEPALIVE_S:
                    yield ": waiting for the node\n\n"  # an SSE comment: clients skip it
                    last_sent = time.monotonic()
                elif event.kind == "error":
                    status = int(event.data.get("status", 500))
                    type_ = "invalid_request_error" if status < 500 else "server_error"
                    type_ = "rate_limit_error" if status == 429 else type_
                    raise OpenAIError(event.data["message"], status=status, type_=type_)
                elif event.kind == "done":
                    completion = Completion.from_json(event.data)
    except StreamTimeout as exc:
        type_ = "timeout" if exc.status == 504 else "server_error"
        yield _sse(OpenAIError(str(exc), status=exc.status, type_=type_).body())
        yield "data: [DONE]\n\n"
        return
    except OpenAIError as exc:
        yield _sse(exc.body())
        yield "data: [DONE]\n\n"
        return
    assert completion is not None  # stream_events ends with done, an error, or StreamTimeout
    finish_reason = completion.finish_reason
    yield _sse(chunk(id_=id_, model=model, created=created, delta={}, finish_reason=finish_reason))
    if request.include_usage:
        final = chunk(id_=id_, model=model, created=created, usage_=usage(completion))
        # Not OpenAI's: the engine's timings, as in a plain answer.
        final["metrics"] = completion.metrics.to_json()
        yield _sse(final)
    yield "data: [DONE]\n\n"


@csrf_exempt  # a JSON API for machine clients; what a browser could forge: same_site_json
@api_key_required
@same_site_json
async def chat_completions(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _error(OpenAIError("use POST", status=405, type_="invalid_request_error"))
    try:
        body = body_parse(request.body)
        chat = chat_request_parse(
            body, served_model=_served_model(), default_priority=settings.INFERENCE_PRIORITY_V1
        )
        identity = await request_identity(request)
        salt = v1_cache_salt(identity=identity, client_salt=chat.completion_request.cache_salt)
        chat = dataclasses.replace(
            chat,
            completion_request=dataclasses.replace(chat.completion_request, cache_salt=salt),
        )
        id_ = completion_id()
        slot = await in_flight_acquire(identity)
    except OpenAIError as exc:
        return _error(exc)
    try:
        if chat.stream:
            node, _ = await sync_to_async(_send, thread_sensitive=False)(
                chat, stream_key=completion_stream_key(id_), identity=identity
            )
            response = StreamingHttpResponse(
                _stream(chat, node, id_, slot), content_type="text/event-stream"
            )
            slot = None  # the stream gives it back when it ends
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"
            return response
        # No stream is written under this key: only its cancel key is used.
        cancel_key = completion_stream_key(id_)
        node, result = await sync_to_async(_send, thread_sensitive=False)(
            chat, stream_key=None, identity=identity, cancel_key=cancel_key
        )
        completion = await _answer(node, result, cancel_key)
    except OpenAIError as exc:
        return _error(exc)
    finally:
        await in_flight_release(slot)
    return JsonResponse(chat_completion_body(id_=id_, model=chat.model, completion=completion))


@api_key_required
async def models(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return _error(OpenAIError("use GET", status=405))
    model = {"id": _served_model(), "object": "model", "created": 0, "owned_by": "pokomachi"}
    return JsonResponse({"object": "list", "data": [model]})
