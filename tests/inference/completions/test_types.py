"""The typed seam (inference/completions/types.py): a CompletionRequest checked on construction, and
the JSON forms that cross the Celery task behind /v1 and are stored as a decision's `metrics` — the
engine's exactly RequestMetrics' fields, and every form read back to the same object."""

from __future__ import annotations

import dataclasses
import json

import pytest

from inference.completions.types import Completion, CompletionMetrics, CompletionRequest
from inference.engine.metrics import RequestMetrics
from inference.errors import CompletionInputError

MESSAGES = [{"role": "user", "content": "Where do you go?"}]


def _request_metrics() -> RequestMetrics:
    return RequestMetrics(
        queue_s=0.01,
        prefill_s=0.2,
        decode_s=1.5,
        ttft_s=0.21,
        e2e_s=1.71,
        num_prompt_tokens=900,
        num_cached_tokens=512,
        num_output_tokens=30,
        num_preemptions=1,
        num_forced_tokens=7,
        num_lost_to_retention=64,
        num_lost_to_alignment=16,
        num_lost_to_eviction=128,
        num_cold_tokens=180,
        reuse_source="breakpoint",
        weights="int4",
    )


def _json_round_trip(data: dict) -> dict:
    return json.loads(json.dumps(data))


def test_engine_metrics_keep_request_metrics_fields_and_lost_tokens():
    engine = _request_metrics()
    metrics = CompletionMetrics.from_request_metrics(engine)
    assert (
        metrics.lost_tokens
        == engine.lost_tokens()
        == {
            "retention": 64,
            "alignment": 16,
            "eviction": 128,
        }
    )
    assert metrics.backend is None and metrics.client_e2e_s is None
    # What a decision stores and /v1 sends beside its usage: RequestMetrics as it always was.
    assert metrics.to_json() == dataclasses.asdict(engine)
    assert CompletionMetrics.from_json(_json_round_trip(metrics.to_json())) == metrics


def test_server_metrics_round_trip_with_unknown_counts():
    metrics = CompletionMetrics(
        queue_s=None,
        prefill_s=None,
        decode_s=2.0,
        ttft_s=0.4,
        e2e_s=2.4,
        num_prompt_tokens=None,
        num_cached_tokens=None,
        num_output_tokens=None,
        backend="openai:http://gpu1:8000/v1",
        client_ttft_s=0.4,
        client_e2e_s=2.4,
    )
    data = metrics.to_json()
    assert data["num_cached_tokens"] is None and data["queue_s"] is None  # unknown, said so
    assert "num_forced_tokens" not in data and "reuse_source" not in data  # the engine's only
    assert not any(key.startswith("num_lost_to_") for key in data)
    assert data["backend"] == "openai:http://gpu1:8000/v1"
    assert CompletionMetrics.from_json(_json_round_trip(data)) == metrics


def test_a_completion_crosses_the_task_boundary_as_json():
    completion = Completion(
        text='{"action": "go"}',
        token_ids=[5, 6, 7],
        finish_reason="stop",
        num_prompt_tokens=900,
        metrics=CompletionMetrics.from_request_metrics(_request_metrics()),
    )
    data = _json_round_trip(completion.to_json())
    assert data["metrics"] == dataclasses.asdict(_request_metrics())
    assert Completion.from_json(data) == completion


def test_a_request_crosses_the_task_boundary_as_json_with_defaults_for_what_is_left_out():
    request = CompletionRequest(
        messages=MESSAGES,
        json_schema={"type": "object"},
        max_tokens=12,
        temperature=0.7,
        top_p=0.9,
        seed=3,
        stop=["\n"],
        cache_salt="run-1",
    )
    assert CompletionRequest.from_json(_json_round_trip(request.to_json())) == request
    short = CompletionRequest.from_json(
        {"messages": MESSAGES, "json_schema": None, "max_tokens": 4}
    )
    assert (short.temperature, short.top_p, short.seed, short.stop, short.cache_salt) == (
        0.0,
        1.0,
        None,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"messages": []}, "messages must be a non-empty list"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, r"messages\[0\] must be a dict"),
        ({"messages": [{"role": "user", "content": 3}]}, r"messages\[0\]"),
        ({"json_schema": "not a dict"}, "json_schema must be a dict"),
    ],
)
def test_a_bad_request_is_refused_on_construction(fields, message):
    with pytest.raises(CompletionInputError, match=message):
        CompletionRequest(**{"messages": MESSAGES, "json_schema": None, "max_tokens": 4, **fields})
