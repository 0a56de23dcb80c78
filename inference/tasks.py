"""Celery tasks of the inference app: one OpenAI-style chat completion, run on the engine of the
node whose queue it was sent to (the web's /v1/chat/completions waits for its result).

At most once: the message is acknowledged when a worker takes it (acks_late off), because a
completion redelivered after a worker died would come back long after its HTTP client gave up.
Bad input is an answer, not a failure: it comes back as {"error": ...} for the web to send as 400.
With a stream key, the text also goes to that Redis stream as it is decoded
(inference/completions/streams.py), ending with the same result or the error.

A schema compile never holds a worker thread (the node has few; a slow legal schema takes tens
of seconds): a completion whose schema this node has not compiled starts the compile
(inference/completions/schema_compiles.py), ends this run without a result, and is sent again under
the same task id, which the web keeps waiting on, once the compile is done. The tick's warm-up
(`schemas_warm`) stores its answer from the compiles' callback the same way.

Deadline: the web gives up after settings.OPENAI_API_TIMEOUT_S, so the completion is aborted in
the engine (its KV blocks freed) once that long has passed since the task first started, and
the answer is {"error": ..., "status": 504}. Celery's soft/hard time limits are set a little later
as a backstop, but only a prefork pool enforces them: node workers run `--pool threads`, which
ignores them, so the engine deadline is what ends a completion.
"""

from __future__ import annotations

import contextlib
import logging
import time
from concurrent import futures
from concurrent.futures import Future
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Ignore, SoftTimeLimitExceeded
from django.conf import settings

from inference.completions.schema_compiles import schema_compile_pending
from inference.completions.streams import CancelWatch, StreamCancelled, StreamPublisher
from inference.engine import EngineShutDown
from inference.errors import CompileLimitError, CompletionInputError, CompletionTimeoutError
from inference.fleet.health import node_states
from inference.fleet.nodes import node_queue
from inference.fleet.task_queue import task_send
from inference.services import (
    CompletionRequest,
    completion_generate,
    completion_schemas_warm_start,
)

logger = logging.getLogger(__name__)


# Past the engine deadline (OPENAI_API_TIMEOUT_S): for prefork pools only, see above.
SOFT_TIME_LIMIT_S = settings.OPENAI_API_TIMEOUT_S + 30
TIME_LIMIT_S = settings.OPENAI_API_TIMEOUT_S + 60


def _timeout_message(exc: BaseException) -> str:
    return f"the completion ran out of time on the node: {exc}"


@shared_task(
    bind=True,
    name="inference.chat_completion",
    acks_late=False,
    soft_time_limit=SOFT_TIME_LIMIT_S,
    time_limit=TIME_LIMIT_S,
)
def chat_completion(
    self: Task,
    request: dict[str, Any],
    stream_key: str | None = None,
    cancel_key: str | None = None,
    identity: str | None = None,
    deadline: float | None = None,
) -> dict[str, Any]:
    """`request`: a CompletionRequest's JSON (CompletionRequest.to_json). Returns the completion's
    JSON (Completion.to_json), or {"error": why} ({"error": why, "status": 504} when it ran out
    of time, 499 when its client left, 429 with "retry_after_s" past the caller's share of
    schema compiles); with `stream_key`, streams it there as well. A plain completion with
    `cancel_key` is aborted once its client left (CancelWatch). `identity`: the /v1 caller whose
    share of this node's schema compiles it uses (inference/completions/schema_compiles.py).
    `deadline` (epoch seconds): when the completion's time ends, counted from the task's first start
    (the task sends itself again with it while its schema compiles)."""
    timeout_s = settings.OPENAI_API_TIMEOUT_S
    if deadline is None:  # the first run
        deadline = time.time() + timeout_s
    else:  # run again once its schema compiled: what is left of its time
        timeout_s = max(round(deadline - time.time(), 1), 0.1)
    try:
        completion_request = CompletionRequest.from_json(request)
        pending = schema_compile_pending(
            json_schema=completion_request.json_schema, identity=identity
        )
    except CompletionInputError as exc:
        return _refused(stream_key, str(exc), status=400)
    except CompileLimitError as exc:
        return _refused(stream_key, str(exc), status=429, retry_after_s=exc.retry_after_s)
    if pending is not None:
        _run_again_once_compiled(self, pending, deadline=deadline)
    if stream_key is None:
        watch = CancelWatch(cancel_key) if cancel_key is not None else None
        try:
            with watch or contextlib.nullcontext():
                completion = completion_generate(
                    request=completion_request,
                    on_text=watch.check if watch is not None else None,
                    timeout_s=timeout_s,
                )
            return completion.to_json()
        except CompletionInputError as exc:
            return {"error": str(exc)}
        except (CompletionTimeoutError, SoftTimeLimitExceeded) as exc:
            return {"error": _timeout_message(exc), "status": 504}
        except StreamCancelled as exc:  # the engine request is aborted: nobody waits for it
            logger.info("%s; the completion was aborted", exc)
            return {"error": str(exc), "status": 499}
    with StreamPublisher(stream_key) as stream:
        try:
            completion = completion_generate(
                request=completion_request, on_text=stream.delta, timeout_s=timeout_s
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


def _refused(
    stream_key: str | None, message: str, *, status: int, retry_after_s: int | None = None
) -> dict[str, Any]:
    """The answer to a request refused before it reached the engine (told to its stream too)."""
    if stream_key is not None:
        with StreamPublisher(stream_key) as stream:
            stream.error(f"the node refused the request: {message}", status=status)
    answer: dict[str, Any] = {"error": message, "status": status}
    if retry_after_s is not None:
        answer["retry_after_s"] = retry_after_s
    return answer


def _run_again_once_compiled(task: Task, pending: Future, *, deadline: float) -> None:
    """While the completion's schema compiles, give this worker thread back: the task is sent
    again to this node's queue, under the same id (what its caller waits on), once the compile
    is done, and this run ends without a result (Ignore). Run outside a worker (called
    directly), nothing would take it again: wait here."""
    request = task.request
    queue = (request.delivery_info or {}).get("routing_key")
    if request.called_directly or request.is_eager or not queue:
        futures.wait([pending])
        return
    task_id, args = request.id, list(request.args or [])
    kwargs = {**(request.kwargs or {}), "deadline": deadline}

    def send_again(_: Future) -> None:
        try:
            task_send(
                task,
                args=args,
                kwargs=kwargs,
                queue=queue,
                task_id=task_id,
                expires=max(deadline - time.time(), 1.0),
            )
        except Exception:  # the queue is down: its caller's deadline answers it (504)
            logger.exception("completion %s: not sent again after its schema compiled", task_id)

    pending.add_done_callback(send_again)
    raise Ignore()


@shared_task(bind=True, name="inference.schemas_warm", acks_late=False)
def schemas_warm(self: Task, json_schemas: list[dict[str, Any]]) -> list[str | None]:
    """Compile these JSON schemas on this node's engine (completion_schemas_warm) without holding
    a worker thread while they compile: the answer is stored for this task's id once they are
    all done, and this run ends without one (Ignore)."""
    warmed = completion_schemas_warm_start(json_schemas=json_schemas)
    request = self.request
    if warmed.done() or request.called_directly or request.is_eager:
        return warmed.result()

    def answer(_: Future) -> None:
        try:
            self.backend.mark_as_done(request.id, warmed.result(), request=request)
        except EngineShutDown:  # the worker is stopping: the tick's wait times out
            logger.info("schemas_warm %s: the engine shut down before they compiled", request.id)
        except Exception:  # Redis is down: the tick's wait times out
            logger.exception("schemas_warm %s: no answer stored", request.id)

    warmed.add_done_callback(answer)
    raise Ignore()


def schemas_warm_on_nodes(
    *, node_to_schemas: dict[str, list[dict[str, Any]]], timeout_s: float
) -> dict[str, list[str | None] | None]:
    """Have each node compile its schemas and wait for them all, at most `timeout_s` in all;
    per node, what schemas_warm answered, or None when it did not answer in time or is down (no
    heartbeat: nobody would take the task): its requests then compile what they need."""
    up = {state.node for state in node_states(list(node_to_schemas)) if state.is_up}
    results = {
        node: task_send(schemas_warm, args=[schemas], queue=node_queue(node))
        for node, schemas in node_to_schemas.items()
        if schemas and node in up
    }
    deadline = time.monotonic() + timeout_s
    answers: dict[str, list[str | None] | None] = dict.fromkeys(node_to_schemas)
    for node, result in results.items():
        try:
            answers[node] = result.get(timeout=max(deadline - time.monotonic(), 0.01))
        except Exception as exc:  # a timeout, or the node failed the warm: not fatal
            logger.warning("node %s did not warm its schemas: %s", node, exc)
            answers[node] = None
        finally:
            result.forget()
    return answers
