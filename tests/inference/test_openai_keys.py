"""/v1's API keys (POKOMACHI_API_KEYS, vLLM's --api-key) and its `priority` field."""

from __future__ import annotations

import pytest
from django.test import Client

from inference.openai_api.protocol import OpenAIError, chat_request_parse

MODEL = "smollm2-tiny-random"  # what pokosite.settings.test serves


def test_with_keys_set_a_missing_or_wrong_key_is_refused_in_openai_shape(db, settings):
    settings.OPENAI_API_KEYS = ["key-one", "key-two"]
    client = Client()
    missing = client.get("/v1/models")
    wrong = client.get("/v1/models", headers={"Authorization": "Bearer key-three"})
    for response in (missing, wrong):
        assert response.status_code == 401
        error = response.json()["error"]
        assert error["code"] == "invalid_api_key" and "POKOMACHI_API_KEYS" in error["message"]
    assert "no API key was sent" in missing.json()["error"]["message"]
    chat = client.post(
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        content_type="application/json",
        headers={"Authorization": "Bearer key-on"},
    )
    assert chat.status_code == 401
    right = client.get("/v1/models", headers={"Authorization": "Bearer key-two"})
    assert right.status_code == 200 and right.json()["data"][0]["id"] == MODEL


def test_without_keys_v1_reads_no_key(db, settings):
    settings.OPENAI_API_KEYS = []
    response = Client().get("/v1/models", headers={"Authorization": "Bearer anything"})
    assert response.status_code == 200


def test_priority_defaults_to_the_setting_and_takes_vllms_field():
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    parsed = chat_request_parse(body, served_model=MODEL, default_priority=-2)
    assert parsed.completion_request.priority == -2
    parsed = chat_request_parse({**body, "priority": 7}, served_model=MODEL, default_priority=-2)
    assert parsed.completion_request.priority == 7
    assert parsed.completion_request.to_json()["priority"] == 7
    with pytest.raises(OpenAIError, match="priority must be a whole number") as caught:
        chat_request_parse({**body, "priority": 1.5}, served_model=MODEL)
    assert caught.value.param == "priority"
