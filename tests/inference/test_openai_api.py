"""The OpenAI-compatible endpoint: the official `openai` client against a real daphne server and
a real Celery worker (tiny model) — plain, JSON schema, streaming, cached tokens — and every
error answer in OpenAI's shape through Django's test client."""

from __future__ import annotations

import json
import uuid

import jsonschema
import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client

from inference.openai_api.protocol import OpenAIError, chat_request_parse

MODEL = "smollm2-tiny-random"  # what pokosite.settings.test serves
LONG_QUESTION = (
    "Pokomachi is a small town with a kissaten, a bakery famous for melon pan, a bookshop with a "
    "reading corner, a park with cherry trees and a quiet shrine on a hill. It is seven in the "
    "morning and the bakery has just opened. Where should a hungry retired teacher go first?"
)
PLACE_SCHEMA = {
    "type": "object",
    "properties": {
        "place": {"type": "string", "enum": ["bakery", "park", "shrine"]},
        "minutes": {"type": "integer", "minimum": 1, "maximum": 90},
    },
    "required": ["place", "minutes"],
    "additionalProperties": False,
}


def test_the_openai_client_plain_json_schema_streaming_and_cached_tokens(openai_server):
    import openai

    base_url, _worker = openai_server
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    assert [m.id for m in client.models.list().data] == [MODEL]

    messages = [{"role": "user", "content": LONG_QUESTION}]
    first = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0
    )
    assert first.object == "chat.completion" and first.model == MODEL
    choice = first.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert first.usage.prompt_tokens > 64 and 1 <= first.usage.completion_tokens <= 12
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    # The same prompt again: all of it but the last token comes from the node's prefix cache
    # (token-exact reuse: the unfilled last block's slots are copied too).
    second = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == second.usage.prompt_tokens - 1
    assert second.choices[0].message.content == choice.message.content  # greedy

    structured = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=40,
        temperature=0.7,
        seed=3,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "plan", "schema": PLACE_SCHEMA, "strict": True},
        },
    )
    value = json.loads(structured.choices[0].message.content)
    jsonschema.validate(value, PLACE_SCHEMA)

    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 2
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens_details.cached_tokens >= 48

    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-9", messages=messages)
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="the engine refused"):
        client.chat.completions.create(  # a prompt longer than the model's context
            model=MODEL, messages=[{"role": "user", "content": "melon pan " * 6000}], max_tokens=4
        )
    deep: dict = {"type": "integer"}  # 40 nested arrays: over the engine's max_depth
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    with pytest.raises(openai.BadRequestError, match=r"max_depth=32 \(it nests 41 levels deep\)"):
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "d", "schema": deep}},
        )


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"messages": []}, "messages", "non-empty list"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "must be one of"),
        ({"max_tokens": 0}, "max_tokens", "from 1 to"),
        ({"temperature": 3}, "temperature", "within [0, 2]"),
        ({"top_p": 0}, "top_p", "within (0, 1]"),
        ({"n": 2}, "n", "n must be 1"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "1 to 4"),
        ({"seed": "x"}, "seed", "whole number"),
        ({"response_format": {"type": "yaml"}}, "response_format", "json_schema"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "schema"),
        ({"tools": [{"type": "function"}]}, "tools", "not supported"),
        ({"node": "spark-z"}, "node", "unknown inference node 'spark-z'"),
    ],
)
def test_bad_requests_are_400_in_openai_shape(db, body, param, words):
    request = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **body}
    response = Client().post("/v1/chat/completions", request, content_type="application/json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"]
    assert error["type"] == "invalid_request_error"


def test_unknown_model_malformed_json_and_wrong_methods(db):
    client = Client()
    missing = client.post(
        "/v1/chat/completions",
        {"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]},
        content_type="application/json",
    )
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert MODEL in missing.json()["error"]["message"]
    broken = client.post("/v1/chat/completions", "{oops", content_type="application/json")
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"]["message"]
    assert client.get("/v1/chat/completions").status_code == 405
    assert client.post("/v1/models").status_code == 405
    assert client.get("/v1/models").json()["data"][0]["id"] == MODEL


def test_a_node_without_a_worker_times_out_with_504(db, redis_url, settings):
    node = f"nobody-{uuid.uuid4().hex[:8]}"
    settings.INFERENCE_NODES = [*settings.INFERENCE_NODES, node]
    settings.OPENAI_API_TIMEOUT_S = 0.5
    response = Client().post(
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "node": node},
        content_type="application/json",
    )
    assert response.status_code == 504
    assert f"no answer from node '{node}'" in response.json()["error"]["message"]


def test_a_streamed_request_no_worker_takes_ends_with_an_error_event(db, redis_url, settings):
    node = f"nobody-{uuid.uuid4().hex[:8]}"
    settings.INFERENCE_NODES = [*settings.INFERENCE_NODES, node]
    settings.OPENAI_API_TIMEOUT_S = 0.5
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "node": node}

    async def post() -> tuple[int, list[str]]:
        response = await AsyncClient().post(
            "/v1/chat/completions", {**body, "stream": True}, content_type="application/json"
        )
        events = [part.decode() async for part in response.streaming_content]
        return response.status_code, events

    status, events = async_to_sync(post)()
    assert status == 200 and response_is_sse(events)
    assert json.loads(events[0].removeprefix("data: "))["choices"][0]["delta"]["role"]
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["type"] == "timeout" and f"no answer from node '{node}'" in error["message"]
    assert events[-1] == "data: [DONE]\n\n"


def response_is_sse(events: list[str]) -> bool:
    return all(e.startswith(("data: ", ": ")) and e.endswith("\n\n") for e in events)


def test_request_parsing_maps_roles_parts_and_formats():
    chat = chat_request_parse(
        {
            "model": MODEL,
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "max_completion_tokens": 7,
            "stop": "\n",
            "response_format": {"type": "json_object"},
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        served_model=MODEL,
    )
    assert chat.completion_request.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "ab"},
    ]
    assert chat.completion_request.max_tokens == 7 and chat.completion_request.stop == ["\n"]
    assert chat.completion_request.json_schema == {"type": "object"}
    assert chat.stream and chat.include_usage and chat.completion_request.temperature == 1.0
    with pytest.raises(OpenAIError, match="only text parts"):
        chat_request_parse(
            {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
            served_model=MODEL,
        )
