"""The OpenAI chat-completions protocol: a request body checked and turned into a
CompletionRequest, and the response, stream chunks and errors OpenAI's clients
expect (`usage.prompt_tokens_details.cached_tokens` included).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

from inference.completions.types import Completion, CompletionRequest

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
UNSUPPORTED = ("tools", "tool_choice", "functions", "function_call", "logprobs", "audio")
DEFAULT_MAX_TOKENS = 512
# Above any served model's context; the engine caps max_tokens at what the context leaves after
# the prompt (the answer then ends with finish_reason "length"), as vLLM does.
MAX_TOKENS_LIMIT = 1 << 20
MAX_STOP_STRINGS = 4


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        type_: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.type = status, param, code, type_

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": str(self),
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class RateLimitError(OpenAIError):
    """429: the caller has used its share of something; `retry_after_s` for Retry-After."""

    def __init__(self, message: str, *, retry_after_s: int, code: str) -> None:
        super().__init__(message, status=429, type_="rate_limit_error", code=code)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str
    node: str | None
    stream: bool
    include_usage: bool
    completion_request: CompletionRequest


def body_parse(raw: bytes) -> Any:
    """The request body as JSON; OpenAIError for what is not JSON or what no client means: NaN
    and ±Infinity (Python's json takes them), and nesting too deep to parse."""

    def refuse_constant(name: str) -> None:
        raise OpenAIError(f"the request body is not valid JSON: {name} is not a JSON number")

    try:
        return json.loads(raw or b"null", parse_constant=refuse_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise OpenAIError(f"the request body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise OpenAIError("the request body is nested too deeply to parse") from None


def _text(value: str, param: str) -> str:
    """Text the tokenizer can take: a lone surrogate (\\ud800) is no character."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise OpenAIError(
            f"{param} contains a lone surrogate ({value[exc.start]!r} at {exc.start}): "
            "not valid Unicode text",
            param=param,
        ) from None
    return value


def _content_text(content: Any, index: int) -> str:
    return _text(_content_parts(content, index), f"messages[{index}].content")


def _content_parts(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise OpenAIError(
                    f"messages[{index}].content: only text parts are supported "
                    '({"type": "text", "text": ...})',
                    param=f"messages[{index}].content",
                )
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise OpenAIError(
        f"messages[{index}].content must be a string or a list of text parts",
        param=f"messages[{index}].content",
    )


def _messages(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise OpenAIError(
            'messages must be a non-empty list of {"role": ..., "content": ...}', param="messages"
        )
    messages = []
    for index, message in enumerate(raw):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise OpenAIError(
                f"messages[{index}].role must be one of {sorted(ROLES)}, got {role!r}",
                param=f"messages[{index}].role",
            )
        messages.append(
            {"role": ROLES[role], "content": _content_text(message.get("content"), index)}
        )
    return messages


def _number(body: dict, name: str, default: float, low: float, high: float, *, open_low=False):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise OpenAIError(f"{name} must be a finite number, got {value!r}", param=name)
    if value < low or value > high or (open_low and value == low):
        bounds = f"{'(' if open_low else '['}{low:g}, {high:g}]"
        raise OpenAIError(f"{name} must be within {bounds}, got {value!r}", param=name)
    return value


def _max_tokens(body: dict) -> int:
    name = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    value = body.get(name)
    if value is None:
        return DEFAULT_MAX_TOKENS
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS_LIMIT:
        shown = value if not isinstance(value, int) or value < 10**12 else f"{str(value)[:12]}…"
        raise OpenAIError(
            f"{name} must be a whole number from 1 to {MAX_TOKENS_LIMIT} (the answer is cut at "
            f"what the model's context leaves after the prompt), got {shown!r}",
            param=name,
        )
    return value


def _stop(raw: Any) -> list[str] | None:
    if raw is None:
        return None
    stops = [raw] if isinstance(raw, str) else raw
    if (
        not isinstance(stops, list)
        or not 1 <= len(stops) <= MAX_STOP_STRINGS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise OpenAIError(
            f"stop must be a non-empty string or a list of 1 to {MAX_STOP_STRINGS} of them",
            param="stop",
        )
    return [_text(s, "stop") for s in stops]


def _json_schema(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = raw.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise OpenAIError(
                'response_format.json_schema must be {"name": ..., "schema": {a JSON schema}}',
                param="response_format.json_schema",
            )
        return schema
    raise OpenAIError(
        f'response_format.type must be "text", "json_object" or "json_schema", got {kind!r}',
        param="response_format",
    )


def chat_request_parse(body: Any, *, served_model: str, default_priority: int = 0) -> ChatRequest:
    """The request body as a ChatRequest, or OpenAIError saying which field is wrong and why.
    `priority` is vLLM's (lower is served first); `default_priority` when it is left out."""
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError("model is required: the name of the served model", param="model")
    if model != served_model:
        raise OpenAIError(
            f"The model `{model}` does not exist: this server serves `{served_model}` "
            "(GET /v1/models)",
            status=404,
            param="model",
            code="model_not_found",
        )
    for name in UNSUPPORTED:
        if body.get(name) not in (None, False, [], {}):
            raise OpenAIError(f"{name} is not supported by this server", param=name)
    if body.get("n") not in (None, 1):
        raise OpenAIError(f"n must be 1 (one choice per request), got {body['n']!r}", param="n")
    seed = body.get("seed")
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63
    ):
        raise OpenAIError(f"seed must be a whole number in [0, 2^63), got {seed!r}", param="seed")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise OpenAIError(f"stream must be true or false, got {stream!r}", param="stream")
    options = body.get("stream_options") or {}
    cache_salt = body.get("cache_salt")
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise OpenAIError(
            "cache_salt must be a non-empty string (requests share cached prefixes only when "
            "their salts are equal, as in vLLM)",
            param="cache_salt",
        )
    if cache_salt is not None:
        _text(cache_salt, "cache_salt")
    priority = body.get("priority", default_priority)
    if priority is None:
        priority = default_priority
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) >= 2**31:
        raise OpenAIError(
            f"priority must be a whole number (lower is served first), got {priority!r}",
            param="priority",
        )
    node = body.get("node")
    if node is not None and not isinstance(node, str):
        raise OpenAIError("node must be the name of an inference node", param="node")
    return ChatRequest(
        model=model,
        node=node,
        stream=stream,
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        completion_request=CompletionRequest(
            messages=_messages(body.get("messages")),
            json_schema=_json_schema(body.get("response_format")),
            max_tokens=_max_tokens(body),
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=_number(body, "top_p", 1.0, 0.0, 1.0, open_low=True),
            seed=seed,
            stop=_stop(body.get("stop")),
            cache_salt=cache_salt,
            priority=priority,
        ),
    )


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def usage(completion: Completion) -> dict[str, Any]:
    metrics = completion.metrics
    prompt = _count(metrics.num_prompt_tokens, completion.num_prompt_tokens)
    output = _count(metrics.num_output_tokens, len(completion.token_ids))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
        # None when unknown (an external server that does not report it), never a made-up 0.
        "prompt_tokens_details": {"cached_tokens": metrics.num_cached_tokens},
    }


def _count(reported: int | None, fallback: int) -> int:
    """A backend's token count; when it reported none (an external server that sent no usage),
    what this side knows."""
    return reported if reported is not None else fallback


def chat_completion_body(*, id_: str, model: str, completion: Completion) -> dict[str, Any]:
    return {
        "id": id_,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": completion.text},
                "finish_reason": completion.finish_reason,
                "logprobs": None,
            }
        ],
        "usage": usage(completion),
        # Not OpenAI's: the engine's timings (vLLM definitions), for side-by-side comparison.
        "metrics": completion.metrics.to_json(),
    }


def chunk(
    *,
    id_: str,
    model: str,
    created: int,
    delta: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    usage_: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One chat.completion.chunk; with `usage_` and no delta, the final usage-only chunk."""
    choices = (
        []
        if delta is None
        else [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]
    )
    body: dict[str, Any] = {
        "id": id_,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage_ is not None:
        body["usage"] = usage_
    return body
