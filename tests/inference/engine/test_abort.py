"""Aborting: a caller that gives up (closed stream, timeout, abort) frees its request's blocks,
and the requests batched with it go on with the same tokens."""

from __future__ import annotations

import threading
import time

import pytest

from inference.engine import RequestAbortedError, SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
# Thousands of tokens: seconds of steps, so an abort that did not happen shows.
ENDLESS = SamplingParams(max_tokens=3000, temperature=0.0, ignore_eos=True)
OTHERS = [f"resident {i} wakes up" for i in range(3)]


def _wait_idle(engine, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (stats := engine.stats()).num_running or stats.num_waiting:
        assert time.monotonic() < deadline, "the given-up request is still running"
        time.sleep(0.01)


def test_a_stream_closed_early_frees_its_blocks_and_the_others_are_unchanged(make_tiny_engine):
    engine = make_tiny_engine()
    expected = {p: engine.generate(p, GREEDY)[0].token_ids for p in OTHERS}
    assert engine.stats().kv_cache_usage == 0.0
    stream = engine.generate_stream("a long walk through the town", ENDLESS)
    next(stream)  # running
    results = {}
    threads = [
        threading.Thread(
            target=lambda p=p: results.__setitem__(p, engine.generate(p, GREEDY)[0].token_ids)
        )
        for p in OTHERS
    ]
    for thread in threads:
        thread.start()
    for _ in range(5):
        next(stream)
    stream.close()  # the SSE client went away
    for thread in threads:
        thread.join(timeout=60)
    assert results == expected
    _wait_idle(engine)
    assert engine.stats().kv_cache_usage == 0.0


def test_an_aborted_request_raises_a_clear_error(make_tiny_engine):
    engine = make_tiny_engine()
    stream = engine.generate_stream("a long walk through the town", ENDLESS)
    first = next(stream)
    engine.abort(first.request_id, "the test gave up")
    with pytest.raises(RequestAbortedError, match="was aborted \\(the test gave up\\)"):
        for _ in stream:
            pass
    _wait_idle(engine)
    assert engine.stats().kv_cache_usage == 0.0
    engine.abort(first.request_id)  # finished or unknown ids are ignored
    assert engine.generate("hi", GREEDY)[0].token_ids


@pytest.mark.parametrize("streamed", [False, True])
def test_past_its_timeout_a_request_is_aborted(make_tiny_engine, streamed):
    engine = make_tiny_engine()
    started = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"did not finish within 0\.3 s; it was aborted"):
        if streamed:
            for _ in engine.generate_stream("a long walk", ENDLESS, timeout=0.3):
                pass
        else:
            engine.generate("a long walk", ENDLESS, timeout=0.3)
    assert time.perf_counter() - started < 5.0
    _wait_idle(engine)
    assert engine.stats().kv_cache_usage == 0.0
