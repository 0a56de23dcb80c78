"""The side channel of a streamed completion: one Redis stream per completion id, written by the
node's worker as it decodes and read by the web process that serves the SSE response.

The worker (inference.chat_completion with a stream key) adds entries as they happen:
`started` when it takes the task, `delta` with each piece of text, `alive` every HEARTBEAT_S
while it works (a long prefill sends no text), then `done` with the whole result or `error`.
The web side reads with blocking XREAD, so text is forwarded as soon as it is added. It gives
up, with an error the client can show, when no worker took the task within the queue timeout
(settings.OPENAI_API_TIMEOUT_S) or a worker that started went silent for
settings.OPENAI_STREAM_IDLE_TIMEOUT_S (it died: no more heartbeats), or Redis itself stops
answering (refused, or silent past READ_SOCKET_TIMEOUT_S: a host that vanished sends no reset),
which ends it within seconds (502). Keys expire after KEY_TTL_S, so a stream nobody read does
not linger.

A client that goes away mid-stream (it closed the connection) is told to the worker through a
second key (`stream_cancel`): the worker looks for it on entry and with each heartbeat, and its
next delta then raises StreamCancelled, which closes the engine's stream and so aborts the
request and frees its KV blocks. A plain (non-streamed) completion whose client left is stopped
the same way (CancelWatch: its web view sets the same key when Django cancels it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
from django.conf import settings
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

logger = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
KEY_TTL_S = 3600
READ_BLOCK_S = 1.0  # the longest one XREAD waits, so timeouts and keep-alives are checked
# An XREAD's reply is due within READ_BLOCK_S; a socket silent this long means Redis is gone.
READ_SOCKET_TIMEOUT_S = READ_BLOCK_S + 2.0
READ_CONNECT_TIMEOUT_S = 2.0
READ_RETRIES = 1  # one reconnect (a blip); then the reader is told Redis is down


def completion_stream_key(completion_id: str) -> str:
    return f"{settings.INFERENCE_STREAM_PREFIX}:{completion_id}"


def _cancel_key(stream_key: str) -> str:
    return f"{stream_key}:cancelled"


class StreamCancelled(Exception):
    """The stream's reader went away: the worker stops the completion."""


def stream_cancel(stream_key: str) -> None:
    """(web) The client left: ask the worker to stop. Quick, and never raises."""
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1.0)
        try:
            client.set(_cancel_key(stream_key), 1, ex=KEY_TTL_S)
        finally:
            client.close()
    except redis.RedisError as exc:  # the completion then runs to its deadline
        logger.warning("stream %s: cancel not sent (%s)", stream_key, exc)


class StreamPublisher:
    """The worker's end. Use as a context manager: `started` and heartbeats on entry, the
    heartbeats stop on exit. Send exactly one of `done` / `error` before leaving."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._client = redis.Redis.from_url(settings.REDIS_URL)
        self._lock = threading.Lock()  # the heartbeat thread and the task thread share the client
        self._stopped = threading.Event()
        self._cancelled = threading.Event()  # the reader went away (stream_cancel)
        self._heartbeat = threading.Thread(
            target=self._beat, name=f"stream-heartbeat {key}", daemon=True
        )

    def __enter__(self) -> StreamPublisher:
        self._check_cancelled()  # the client may have left while the task was queued
        self._send("started")
        self._heartbeat.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped.set()
        self._heartbeat.join(timeout=5)
        self._client.close()

    def delta(self, text: str) -> None:
        """Forward text; StreamCancelled once the reader has gone (stream_cancel, seen by the
        heartbeat: within HEARTBEAT_S, and no Redis round trip per piece of text)."""
        if self._cancelled.is_set():
            raise StreamCancelled(f"stream {self.key}: the client went away")
        self._send("delta", {"text": text})

    def done(self, result: dict[str, Any]) -> None:
        self._send("done", result)

    def error(self, message: str, *, status: int) -> None:
        self._send("error", {"message": message, "status": status})

    def _beat(self) -> None:
        while not self._stopped.wait(HEARTBEAT_S):
            try:
                self._send("alive")
                self._check_cancelled()
            except redis.RedisError as exc:  # the stream's reader will time out and say so
                logger.warning("stream %s: heartbeat not sent (%s)", self.key, exc)

    def _check_cancelled(self) -> None:
        with self._lock:
            if self._client.exists(_cancel_key(self.key)):
                self._cancelled.set()

    def _send(self, kind: str, data: dict[str, Any] | None = None) -> None:
        fields = {"kind": kind, "data": json.dumps(data or {}, ensure_ascii=False)}
        with self._lock:
            pipe = self._client.pipeline(transaction=False)
            pipe.xadd(self.key, fields)
            pipe.expire(self.key, KEY_TTL_S)
            pipe.execute()


class CancelWatch:
    """(worker) A plain completion's side of stream_cancel: a thread looks for the cancel key
    every HEARTBEAT_S, and `check` (the completion's on_text) raises StreamCancelled once it
    was set, which aborts the request in the engine. A context manager, like StreamPublisher."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=2.0, socket_connect_timeout=2.0
        )
        self._stopped = threading.Event()
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"cancel-watch {key}", daemon=True)

    def __enter__(self) -> CancelWatch:
        self._look()  # the client may have left while the task was queued
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        self._client.close()

    def check(self, _text: str = "") -> None:
        if self._cancelled.is_set():
            raise StreamCancelled(f"completion {self.key}: the client went away")

    def _watch(self) -> None:
        while not self._stopped.wait(HEARTBEAT_S):
            self._look()

    def _look(self) -> None:
        try:
            if self._client.exists(_cancel_key(self.key)):
                self._cancelled.set()
        except redis.RedisError as exc:  # then it runs to its deadline, as before
            logger.warning("completion %s: cancel key not read (%s)", self.key, exc)


@dataclass(frozen=True, slots=True)
class StreamEvent:
    kind: str  # "delta" | "done" | "error" | "idle" (nothing new for READ_BLOCK_S: a keep-alive)
    data: dict[str, Any]


class StreamTimeout(Exception):
    """The stream gave up; the message says why, `status` is the HTTP status it stands for."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


async def stream_events(key: str, *, node: str) -> AsyncIterator[StreamEvent]:
    """The stream's events as the worker adds them, until `done` or `error` (both yielded), or
    StreamTimeout. `idle` events come at most every READ_BLOCK_S while nothing arrives."""
    client = redis.asyncio.Redis.from_url(
        settings.REDIS_URL,
        socket_timeout=READ_SOCKET_TIMEOUT_S,
        socket_connect_timeout=READ_CONNECT_TIMEOUT_S,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.2), READ_RETRIES),
    )
    queue_deadline = time.monotonic() + settings.OPENAI_API_TIMEOUT_S
    idle_timeout_s = settings.OPENAI_STREAM_IDLE_TIMEOUT_S
    last_id, last_seen, started = "0-0", time.monotonic(), False
    try:
        while True:
            try:
                reply = await client.xread(
                    {key: last_id}, block=int(READ_BLOCK_S * 1000), count=256
                )
            except (redis.RedisError, OSError) as exc:
                raise StreamTimeout(
                    f"the completion's stream from node {node!r} was cut: Redis stopped "
                    f"answering ({type(exc).__name__}: {exc}); the completion is lost: retry",
                    502,
                ) from exc
            now = time.monotonic()
            if not reply:
                if not started and now > queue_deadline:
                    raise StreamTimeout(
                        f"no answer from node {node!r} within {settings.OPENAI_API_TIMEOUT_S:g} s:"
                        f" is its worker running (celery -A pokosite worker -Q {node} "
                        "--pool threads)?",
                        504,
                    )
                if started and now - last_seen > idle_timeout_s:
                    raise StreamTimeout(
                        f"node {node!r} stopped sending for {idle_timeout_s:g} s mid-completion "
                        "(its worker died or lost Redis); the completion is lost: retry",
                        502,
                    )
                yield StreamEvent("idle", {})
                continue
            started, last_seen = True, now
            for entry_id, fields in reply[0][1]:
                last_id = entry_id
                kind = fields[b"kind"].decode()
                if kind in ("started", "alive"):
                    continue
                yield StreamEvent(kind, json.loads(fields[b"data"]))
                if kind in ("done", "error"):
                    return
    finally:
        with contextlib.suppress(redis.RedisError, OSError):
            await client.aclose()
