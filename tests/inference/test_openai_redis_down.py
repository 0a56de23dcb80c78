"""A /v1 stream whose Redis stops answering mid-way ends within seconds with an error event in
OpenAI's shape and [DONE] (issue 33, item 5), for a Redis that is killed (the socket is reset)
and one that is stopped (SIGSTOP: silent, as a host that vanished, which no reset announces).

The stream's side channel is read from an embedded Redis of the test's own (settings.REDIS_URL,
read per request); the task itself goes to the test Redis, on a node no worker serves, and the
test writes what a worker would (`started`, a `delta`) to the stream."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import pytest
import redis
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from inference.completions.streams import completion_stream_key
from pokosite.redis_embedded import EmbeddedRedis

MODEL = "smollm2-tiny-random"


@pytest.fixture
def stream_redis(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis").start()
    yield server
    if server.process is not None and server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_stream_whose_redis_dies_ends_with_an_error_event_within_seconds(
    db, redis_url, settings, stream_redis, how
):
    node = f"nobody-{uuid.uuid4().hex[:8]}"
    settings.INFERENCE_NODES = [*settings.INFERENCE_NODES, node]
    settings.REDIS_URL = stream_redis.url
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "node": node}

    async def post() -> tuple[list[str], float]:
        response = await AsyncClient().post(
            "/v1/chat/completions", {**body, "stream": True}, content_type="application/json"
        )
        assert response.status_code == 200
        parts = aiter(response.streaming_content)
        first = (await anext(parts)).decode()
        id_ = json.loads(first.removeprefix("data: "))["id"]
        worker = redis.Redis.from_url(stream_redis.url)
        key = completion_stream_key(id_)
        worker.xadd(key, {"kind": "started", "data": "{}"})
        worker.xadd(key, {"kind": "delta", "data": json.dumps({"text": "Good"})})
        worker.close()
        events = [first]
        while "Good" not in events[-1]:
            events.append((await anext(parts)).decode())
        if how == "killed":
            stream_redis.process.kill()
        else:
            os.kill(stream_redis.process.pid, signal.SIGSTOP)
        cut = time.monotonic()
        events += [part.decode() async for part in parts]
        return events, time.monotonic() - cut

    events, took_s = async_to_sync(post)()
    assert took_s < 15, f"the stream hung {took_s:.1f} s after Redis died"
    assert events[-1] == "data: [DONE]\n\n"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["type"] == "server_error" and "Redis stopped answering" in error["message"]
