"""What /v1/chat/completions refuses before anything is sent to a node, each a 400 (or 403/415)
in OpenAI's shape: JSON's NaN/Infinity, bodies nested too deep, lone surrogates, numbers out of
range; and what a browser could send behind its user's back (not JSON, another site's Origin)."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from inference.services import completion_model

pytestmark = pytest.mark.django_db


def _post(body: str | dict, **headers):
    data = body if isinstance(body, str) else json.dumps(body)
    return Client().post(
        "/v1/chat/completions", data, content_type="application/json", headers=headers
    )


def _body(**fields) -> dict:
    return {"model": completion_model(), "messages": [{"role": "user", "content": "hi"}], **fields}


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_nan_and_infinity_literals_are_400(field, literal):
    text = json.dumps(_body())[:-1] + f', "{field}": {literal}}}'
    response = _post(text)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert f"{literal} is not a JSON number" in error["message"]


@pytest.mark.parametrize("number", ["1e999", "-1e999"])
def test_a_number_that_overflows_to_infinity_is_400(number):
    response = _post(json.dumps(_body())[:-1] + f', "temperature": {number}}}')
    assert response.status_code == 400 and "finite number" in response.json()["error"]["message"]


def test_a_body_nested_100000_deep_is_400():
    response = _post("[" * 100_000 + "]" * 100_000)
    assert response.status_code == 400
    assert "nested too deeply" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": [{"role": "user", "content": "a\ud800b"}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
            "messages[0].content",
        ),
        ({"stop": ["\ud800"]}, "stop"),
        ({"cache_salt": "x\ud800"}, "cache_salt"),
    ],
)
def test_a_lone_surrogate_is_400_naming_where(fields, param):
    response = _post(json.dumps(_body(**fields)))  # json.dumps escapes it as \ud800
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and "lone surrogate" in error["message"]


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"max_tokens": int("9" * 400)}, "max_tokens", "from 1 to 1048576"),
        ({"max_completion_tokens": 2**64}, "max_completion_tokens", "from 1 to 1048576"),
        ({"seed": 2**64}, "seed", "[0, 2^63)"),
        ({"seed": -1}, "seed", "[0, 2^63)"),
    ],
)
def test_numbers_out_of_range_are_400(fields, param, words):
    response = _post(_body(**fields))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"]
    assert len(error["message"]) < 300  # a 400-digit number is not echoed whole


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_a_post_that_is_not_json_is_415(content_type):
    # What a page on another site can make a browser send with the user's cookies, unpreflighted.
    response = Client().post("/v1/chat/completions", json.dumps(_body()), content_type=content_type)
    assert response.status_code == 415
    assert "Content-Type must be application/json" in response.json()["error"]["message"]


def test_another_sites_origin_is_403_and_the_own_one_passes(settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://town.example.com"]
    refused = _post(_body(max_tokens=0), Origin="https://evil.example")
    assert refused.status_code == 403
    assert "cross-origin requests are refused" in refused.json()["error"]["message"]
    # Same origin, or a trusted one: the request reaches the view (whose 400 shows it did).
    for origin in ("http://testserver", "https://town.example.com"):
        assert _post(_body(max_tokens=0), Origin=origin).status_code == 400
    assert _post(_body(max_tokens=0)).status_code == 400  # no Origin: not a browser
