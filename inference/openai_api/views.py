"""`POST /v1/chat/completions` and `GET /v1/models`, served by the web process and executed on
a node through Celery (`inference.chat_completion`, inference/tasks.py).

The views are async so that waiting for a node never holds a server thread; the task's result
is polled from the result backend. Streaming: the engine returns a completion whole (it has no
per-token callback yet), so the stream sends the role at once, SSE keep-alive comments while
the node works, then one chunk per output token and the usage — OpenAI's wire format, but the
tokens arrive together when generation ends, not as they are sampled.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from inference.errors import UnknownNodeError
from inference.nodes import node_default, node_queue
from inference.openai_api.protocol import (
    ChatRequest,
    OpenAIError,
    chat_completion_body,
    chat_request_parse,
    chunk,
    completion_id,
    usage,
)

POLL_S = 0.05
KEEPALIVE_S = 5.0


def _served_model() -> str:
    return settings.INFERENCE_ENGINE["model"]


def _error(exc: OpenAIError) -> JsonResponse:
    return JsonResponse(exc.body(), status=exc.status)


def _send(request: ChatRequest, *, with_pieces: bool) -> tuple[str, Any]:
    from inference.tasks import chat_completion

    try:
        node = request.node or node_default()
        queue = node_queue(node)
    except UnknownNodeError as exc:
        raise OpenAIError(str(exc), param="node") from exc
    timeout_s = settings.OPENAI_API_TIMEOUT_S
    # expires: a node that comes up after the client gave up drops the request.
    result = chat_completion.apply_async(
        args=[request.generate, with_pieces], queue=queue, expires=timeout_s
    )
    return node, result


def _result_meta(result: Any) -> dict[str, Any]:
    return result.backend.get_task_meta(result.id)


async def _wait(node: str, result: Any, *, deadline: float) -> dict[str, Any] | None:
    """The task's answer; None while it is not there yet and `deadline` has not passed."""
    meta = await sync_to_async(_result_meta, thread_sensitive=False)(result)
    state = meta.get("status")
    if state == "SUCCESS":
        answer = meta["result"]
        if "error" in answer:
            raise OpenAIError(f"the engine refused the request: {answer['error']}")
        return answer
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


async def _answer(node: str, result: Any) -> dict[str, Any]:
    deadline = time.monotonic() + settings.OPENAI_API_TIMEOUT_S
    while (answer := await _wait(node, result, deadline=deadline)) is None:
        await asyncio.sleep(POLL_S)
    return answer


def _sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _stream(request: ChatRequest, node: str, result: Any) -> AsyncIterator[str]:
    id_, created, model = completion_id(), int(time.time()), request.model
    yield _sse(
        chunk(id_=id_, model=model, created=created, delta={"role": "assistant", "content": ""})
    )
    deadline = time.monotonic() + settings.OPENAI_API_TIMEOUT_S
    last_sent = time.monotonic()
    try:
        while (answer := await _wait(node, result, deadline=deadline)) is None:
            if time.monotonic() - last_sent > KEEPALIVE_S:
                yield ": waiting for the node\n\n"  # an SSE comment: clients skip it
                last_sent = time.monotonic()
            await asyncio.sleep(POLL_S)
    except OpenAIError as exc:
        yield _sse(exc.body())
        yield "data: [DONE]\n\n"
        return
    for piece in answer.get("pieces", [answer["text"]]):
        yield _sse(chunk(id_=id_, model=model, created=created, delta={"content": piece}))
    yield _sse(
        chunk(
            id_=id_, model=model, created=created, delta={}, finish_reason=answer["finish_reason"]
        )
    )
    if request.include_usage:
        yield _sse(chunk(id_=id_, model=model, created=created, usage_=usage(answer)))
    yield "data: [DONE]\n\n"


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _error(OpenAIError("use POST", status=405, type_="invalid_request_error"))
    try:
        try:
            body = json.loads(request.body or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise OpenAIError(f"the request body is not valid JSON: {exc}") from exc
        chat = chat_request_parse(body, served_model=_served_model())
        node, result = await sync_to_async(_send, thread_sensitive=False)(
            chat, with_pieces=chat.stream
        )
        if chat.stream:
            response = StreamingHttpResponse(
                _stream(chat, node, result), content_type="text/event-stream"
            )
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"
            return response
        answer = await _answer(node, result)
    except OpenAIError as exc:
        return _error(exc)
    return JsonResponse(chat_completion_body(id_=completion_id(), model=chat.model, result=answer))


async def models(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return _error(OpenAIError("use GET", status=405))
    model = {"id": _served_model(), "object": "model", "created": 0, "owned_by": "pokomachi"}
    return JsonResponse({"object": "list", "data": [model]})
