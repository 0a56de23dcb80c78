"""completion_generate on this process's engine, with the tiny random-weight model (the test
settings' default): shapes of the result, JSON-schema decoding, prefix reuse, bad input."""

from __future__ import annotations

import json
import threading

import pytest

from inference.completions.runtime import engine_get
from inference.errors import CompletionInputError
from inference.services import Completion, CompletionRequest, completion_generate

MESSAGES = [
    {"role": "system", "content": "You are a resident of a small town. Answer briefly."},
    {"role": "user", "content": "It is morning. The bakery and the café are open. What now?"},
]
SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["go", "stay", "rest"]},
        "target": {"type": "string", "enum": ["bakery", "café"]},
    },
    "required": ["action", "target"],
    "additionalProperties": False,
}


def _generate(**request) -> Completion:
    return completion_generate(request=CompletionRequest(**request))


@pytest.fixture(scope="module")
def engine():
    # Several threads asking at once for a process's first engine all get the same one.
    engines: list[object] = []
    threads = [threading.Thread(target=lambda: engines.append(engine_get())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(engines) == 4 and all(e is engines[0] for e in engines)
    return engines[0]


def test_plain_completion(engine):
    completion = _generate(messages=MESSAGES, json_schema=None, max_tokens=8)
    assert isinstance(completion, Completion)
    assert 1 <= len(completion.token_ids) <= 8
    assert completion.finish_reason in ("stop", "length")
    assert isinstance(completion.text, str)
    assert completion.num_prompt_tokens == len(engine.tokenizer.apply_chat_template(MESSAGES))
    metrics = completion.metrics
    assert metrics.num_prompt_tokens == completion.num_prompt_tokens
    assert metrics.num_output_tokens == len(completion.token_ids)
    for name in ("queue_s", "prefill_s", "decode_s", "ttft_s", "e2e_s"):
        assert getattr(metrics, name) >= 0
    assert metrics.e2e_s >= metrics.ttft_s > 0


def test_json_schema_output_is_valid_json_in_the_schema(engine):
    completion = _generate(messages=MESSAGES, json_schema=SCHEMA, max_tokens=64)
    assert completion.finish_reason == "stop", completion.text
    decision = json.loads(completion.text)
    assert set(decision) == {"action", "target"}
    assert decision["action"] in ("go", "stay", "rest")
    assert decision["target"] in ("bakery", "café")


def test_greedy_repeat_is_identical_and_reuses_the_prompt(engine):
    first = _generate(messages=MESSAGES, json_schema=None, max_tokens=6, seed=1)
    again = _generate(messages=MESSAGES, json_schema=None, max_tokens=6, seed=1)
    assert again.token_ids == first.token_ids
    # Same process, same engine: the prompt's full blocks come from the prefix cache.
    block_size = engine.config.block_size
    full_blocks = (first.num_prompt_tokens - 1) // block_size
    assert again.metrics.num_cached_tokens >= full_blocks * block_size > 0


def test_cache_salt_keeps_prefixes_apart(engine):
    salted = _generate(
        messages=MESSAGES, json_schema=None, max_tokens=2, cache_salt="run-that-never-ran-before"
    )
    assert salted.metrics.num_cached_tokens == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"messages": []}, "messages must be a non-empty list"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, r"messages\[0\] must be a dict"),
        ({"messages": [{"role": "user", "content": 3}]}, r"messages\[0\]"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"json_schema": "not a dict"}, "json_schema must be a dict"),
        ({"json_schema": {"type": "no-such-type"}}, "invalid json_schema"),
    ],
)
def test_bad_input_is_a_completion_input_error(engine, kwargs, message):
    call = {"messages": MESSAGES, "json_schema": None, "max_tokens": 4, **kwargs}
    with pytest.raises(CompletionInputError, match=message):
        _generate(**call)
