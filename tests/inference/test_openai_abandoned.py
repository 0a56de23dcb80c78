"""Abandoned /v1 requests stop (issue 33, item 4): a plain (non-streamed) client that disconnects
has its completion aborted on the node within seconds (daphne and a real worker, tiny model),
and one caller's completions in flight are bounded: one more is a 429 with Retry-After."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import openai
import pytest
import requests

from tests.inference.conftest import daphne_start

MODEL = "smollm2-tiny-random"
MESSAGES = [{"role": "user", "content": "Describe the morning market of Pokomachi."}]
ABORTED = "the client went away; the completion was aborted"


def test_a_plain_client_that_disconnects_is_aborted_on_the_node_within_5_s(openai_server):
    base_url, worker = openai_server
    # Thousands of tokens: far longer than the client waits, however fast this machine is.
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 6000, "temperature": 0}
    impatient = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=3)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(**body)
    left = time.monotonic()  # the client closed its connection: it is gone
    while ABORTED not in worker.output():
        assert time.monotonic() - left < 5, "the completion ran on after its client left"
        time.sleep(0.1)
    # The node is free again: a small request is answered at once.
    patient = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    small = patient.chat.completions.create(**{**body, "max_tokens": 4})
    assert small.usage.completion_tokens == 4


def test_one_callers_completions_in_flight_are_bounded_with_429(db, redis_url):
    # daphne, its node served by no worker: each request waits for its 2 s deadline (504).
    node = SimpleNamespace(queue=f"nobody-{uuid.uuid4().hex[:8]}")
    env = {
        "POKOMACHI_OPENAI_TIMEOUT": "2",
        "POKOMACHI_OPENAI_MAX_IN_FLIGHT": "2",
        "POKOMACHI_STREAM_PREFIX": f"test-in-flight-{uuid.uuid4().hex[:8]}",
    }
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4}
    with daphne_start(node, redis_url, env=env) as base_url:
        url = f"{base_url}/chat/completions"

        def post(delay_s: float, **extra) -> requests.Response:
            time.sleep(delay_s)
            return requests.post(url, json={**body, **extra}, timeout=30)

        with ThreadPoolExecutor(3) as pool:
            # Two in flight (one plain, one streamed), then a third while they wait.
            plain = pool.submit(post, 0)
            streamed = pool.submit(post, 0, stream=True)
            third = pool.submit(post, 1.0).result()
            assert plain.result().status_code == 504
            assert streamed.result().text.endswith("data: [DONE]\n\n")
        assert third.status_code == 429 and int(third.headers["Retry-After"]) >= 1
        error = third.json()["error"]
        assert error["type"] == "rate_limit_error" and "in flight" in error["message"]
        assert "POKOMACHI_OPENAI_MAX_IN_FLIGHT" in error["message"]
        # Both slots were given back when their requests ended: the next one is not refused.
        assert post(0).status_code == 504
