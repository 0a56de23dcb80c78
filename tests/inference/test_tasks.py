"""The completion tasks' time bounds: Celery limits set, and past the deadline a clear error
result (the engine request aborted) rather than a task that runs on unread."""

from __future__ import annotations

import time

from inference.completions.runtime import engine_get
from inference.tasks import chat_completion
from town.tasks import decision_compute

MESSAGES = [{"role": "user", "content": "Tell the whole history of the town, street by street."}]


def test_the_completion_tasks_have_soft_and_hard_time_limits(settings):
    assert chat_completion.soft_time_limit > settings.OPENAI_API_TIMEOUT_S
    assert chat_completion.soft_time_limit < chat_completion.time_limit
    # Above any run's decision_timeout_s (default 1200 s): the engine deadline comes first.
    assert 1200 < decision_compute.soft_time_limit < decision_compute.time_limit


def test_a_completion_past_the_deadline_is_a_504_error_result(settings):
    engine = engine_get()
    settings.OPENAI_API_TIMEOUT_S = 0.3
    request = {"messages": MESSAGES, "json_schema": None, "max_tokens": 1500, "temperature": 0}
    started = time.perf_counter()
    answer = chat_completion(request)  # run in this thread, as a worker thread runs it
    assert time.perf_counter() - started < 10
    assert answer["status"] == 504
    assert "ran out of time on the node" in answer["error"]
    assert "did not finish within 0.3 s; it was aborted" in answer["error"]
    deadline = time.monotonic() + 5
    while engine.stats().num_running:  # aborted, not running on unread
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert engine.stats().kv_cache_usage == 0.0


def test_a_too_deep_schema_is_an_error_result_naming_the_limit():
    schema: dict = {"type": "integer"}
    for _ in range(40):
        schema = {"type": "array", "items": schema}
    request = {"messages": MESSAGES, "json_schema": schema, "max_tokens": 8}
    answer = chat_completion(request)
    assert "max_depth=32 (it nests 41 levels deep)" in answer["error"]
    assert "status" not in answer  # bad input: the web answers 400


def test_a_stream_whose_client_left_is_aborted_on_the_node(redis_url):
    import uuid

    from inference.completions.streams import (
        HEARTBEAT_S,
        StreamCancelled,
        StreamPublisher,
        completion_stream_key,
        stream_cancel,
    )

    key = completion_stream_key(f"test-cancel-{uuid.uuid4().hex}")
    with StreamPublisher(key) as publisher:
        publisher.delta("still read")
        stream_cancel(key)  # what the web does when the SSE client goes away
        deadline = time.monotonic() + 3 * HEARTBEAT_S  # the heartbeat looks for the cancel
        try:
            while time.monotonic() < deadline:
                publisher.delta("nobody reads this")
                time.sleep(0.05)
            raise AssertionError("the deltas after the cancel went on")
        except StreamCancelled:
            pass
    # The task: its first delta sees the cancel, the engine request is aborted, blocks freed.
    engine = engine_get()
    key = completion_stream_key(f"test-cancel-{uuid.uuid4().hex}")
    stream_cancel(key)
    request = {"messages": MESSAGES, "json_schema": None, "max_tokens": 1500, "temperature": 0}
    started = time.perf_counter()
    answer = chat_completion(request, key)
    assert answer["status"] == 499 and "the client went away" in answer["error"]
    assert time.perf_counter() - started < 30  # not 1,500 tokens decoded unread
    deadline = time.monotonic() + 5
    while engine.stats().num_running:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert engine.stats().kv_cache_usage == 0.0
