"""The typed seam between the town (and /v1) and inference: a CompletionRequest goes in, a
Completion with its CompletionMetrics comes out, whichever backend answered (this process's
engine, inference/completions/services.py, or an external OpenAI-compatible server,
inference/completions/remote.py).

Django-free and engine-free: plain dataclasses. Where a completion has to cross a process as JSON
(the Celery task behind /v1, inference/tasks.py; a decision's stored `metrics`), it goes through
the one to_json / from_json pair of its dataclass, and nowhere else is it taken apart by key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inference.errors import CompletionInputError

if TYPE_CHECKING:
    from inference.engine.metrics import RequestMetrics

ROLES = ("system", "user", "assistant")
_LOST_PREFIX = "num_lost_to_"  # RequestMetrics' spelling of a lost-token count, kept in JSON


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """One chat completion: chat messages, an optional JSON schema the output must follow, and
    sampling parameters (OpenAI's meanings). `cache_salt`: requests share cached prefixes only
    when their salts are equal (vLLM's). Checked on construction: CompletionInputError."""

    messages: list[dict[str, str]]
    json_schema: dict[str, Any] | None
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] | None = None
    cache_salt: str | None = None
    # The engine's scheduling class (vLLM's priority): lower is served first.
    priority: int = 0
    # Any stable string that keeps related requests on one node while nothing else changes
    # (the town passes one per resident; inference/fleet/router.py: rendezvous hashing); routing
    # reads it, the engine never does. None: no affinity.
    affinity_key: str | None = None

    def __post_init__(self) -> None:
        messages_check(self.messages)
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise CompletionInputError(
                f"priority must be an int (lower is served first), got {self.priority!r}"
            )
        if self.affinity_key is not None and not isinstance(self.affinity_key, str):
            raise CompletionInputError(
                f"affinity_key must be a string or None, got {self.affinity_key!r}"
            )
        if self.json_schema is not None and not isinstance(self.json_schema, dict):
            raise CompletionInputError(
                "json_schema must be a dict (a JSON schema) or None, "
                f"got {type(self.json_schema).__name__}"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "json_schema": self.json_schema,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": self.stop,
            "cache_salt": self.cache_salt,
            "priority": self.priority,
            "affinity_key": self.affinity_key,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompletionRequest:
        """The inverse of to_json; fields left out take their defaults."""
        return cls(**data)


def messages_check(messages: object) -> None:
    if not isinstance(messages, list) or not messages:
        raise CompletionInputError(
            'messages must be a non-empty list of {"role": ..., "content": ...} dicts'
        )
    for index, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or message.get("role") not in ROLES
            or not isinstance(message.get("content"), str)
        ):
            raise CompletionInputError(
                f"messages[{index}] must be a dict with role in {ROLES} and string content, "
                f"got {message!r}"
            )


@dataclass(frozen=True, slots=True)
class CompletionMetrics:
    """One completion's metrics, vLLM's definitions (inference/engine/metrics.py): seconds and
    token counts. None where the backend did not report it: an external server may send no
    usage (token counts) and, unless it is another Pokomachi, no queue or prefill time."""

    queue_s: float | None
    prefill_s: float | None
    decode_s: float | None
    ttft_s: float | None
    e2e_s: float | None
    num_prompt_tokens: int | None
    num_cached_tokens: int | None
    num_output_tokens: int | None
    num_preemptions: int = 0
    # {reason: prompt tokens that matched the cache but were recomputed}; the engine's only.
    lost_tokens: dict[str, int] = field(default_factory=dict)
    # The engine's only (RequestMetrics): None when an external server answered.
    num_forced_tokens: int | None = None
    num_cold_tokens: int | None = None
    reuse_source: str | None = None
    num_replayed_tokens: int | None = None  # DeepSeek-V4's bounded replay (approximate)
    # Of num_cached_tokens, those loaded from the engine's host-memory and disk KV tiers, and
    # the time the request waited for them (the engine's only).
    num_cached_tokens_host: int | None = None
    num_cached_tokens_disk: int | None = None
    kv_load_s: float | None = None
    # The time its JSON schema took to compile, before it was queued (the engine's only).
    grammar_compile_s: float | None = None
    num_draft_tokens: int | None = None  # speculative decoding: drafted, and accepted
    num_accepted_tokens: int | None = None
    weights: str | None = None  # the engine's weight format: "fp32" | "int8" | "int4"
    kv_cache_dtype: str | None = None  # the engine's KV cache: "float32" | "bfloat16"
    priority: int | None = None  # the engine's scheduling class the request ran in
    # An external server's only (inference/completions/remote.py): "openai:<base_url>", and the time
    # to first token and end to end as this client saw them (network included).
    backend: str | None = None
    client_ttft_s: float | None = None
    client_e2e_s: float | None = None

    @classmethod
    def from_request_metrics(cls, metrics: RequestMetrics) -> CompletionMetrics:
        """The engine's per-request metrics."""
        return cls(
            queue_s=metrics.queue_s,
            prefill_s=metrics.prefill_s,
            decode_s=metrics.decode_s,
            ttft_s=metrics.ttft_s,
            e2e_s=metrics.e2e_s,
            num_prompt_tokens=metrics.num_prompt_tokens,
            num_cached_tokens=metrics.num_cached_tokens,
            num_output_tokens=metrics.num_output_tokens,
            num_preemptions=metrics.num_preemptions,
            lost_tokens=metrics.lost_tokens(),
            num_forced_tokens=metrics.num_forced_tokens,
            num_cold_tokens=metrics.num_cold_tokens,
            reuse_source=metrics.reuse_source,
            num_replayed_tokens=metrics.num_replayed_tokens,
            num_cached_tokens_host=metrics.num_cached_tokens_host,
            num_cached_tokens_disk=metrics.num_cached_tokens_disk,
            kv_load_s=metrics.kv_load_s,
            grammar_compile_s=metrics.grammar_compile_s,
            num_draft_tokens=metrics.num_draft_tokens,
            num_accepted_tokens=metrics.num_accepted_tokens,
            weights=metrics.weights,
            kv_cache_dtype=metrics.kv_cache_dtype,
            priority=metrics.priority,
        )

    def to_json(self) -> dict[str, Any]:
        """Flat JSON (a decision's stored `metrics`, /v1's `metrics` beside the usage): the
        engine's in RequestMetrics' own field names (lost tokens as `num_lost_to_<reason>`);
        fields a backend does not have are left out."""
        data: dict[str, Any] = {
            "queue_s": self.queue_s,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "ttft_s": self.ttft_s,
            "e2e_s": self.e2e_s,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_cached_tokens": self.num_cached_tokens,
            "num_output_tokens": self.num_output_tokens,
            "num_preemptions": self.num_preemptions,
        }
        for name in ("num_forced_tokens", "num_draft_tokens", "num_accepted_tokens"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        data.update({f"{_LOST_PREFIX}{reason}": n for reason, n in self.lost_tokens.items()})
        optional = {
            "num_cold_tokens": self.num_cold_tokens,
            "reuse_source": self.reuse_source,
            "num_replayed_tokens": self.num_replayed_tokens,
            "num_cached_tokens_host": self.num_cached_tokens_host,
            "num_cached_tokens_disk": self.num_cached_tokens_disk,
            "kv_load_s": self.kv_load_s,
            "grammar_compile_s": self.grammar_compile_s,
            "weights": self.weights,
            "kv_cache_dtype": self.kv_cache_dtype,
            "priority": self.priority,
            "backend": self.backend,
            "client_ttft_s": self.client_ttft_s,
            "client_e2e_s": self.client_e2e_s,
        }
        data.update({name: value for name, value in optional.items() if value is not None})
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompletionMetrics:
        """The inverse of to_json."""
        return cls(
            queue_s=data["queue_s"],
            prefill_s=data["prefill_s"],
            decode_s=data["decode_s"],
            ttft_s=data["ttft_s"],
            e2e_s=data["e2e_s"],
            num_prompt_tokens=data["num_prompt_tokens"],
            num_cached_tokens=data["num_cached_tokens"],
            num_output_tokens=data["num_output_tokens"],
            num_preemptions=data["num_preemptions"],
            lost_tokens={
                key.removeprefix(_LOST_PREFIX): value
                for key, value in data.items()
                if key.startswith(_LOST_PREFIX)
            },
            num_forced_tokens=data.get("num_forced_tokens"),
            num_cold_tokens=data.get("num_cold_tokens"),
            reuse_source=data.get("reuse_source"),
            num_replayed_tokens=data.get("num_replayed_tokens"),
            num_cached_tokens_host=data.get("num_cached_tokens_host"),
            num_cached_tokens_disk=data.get("num_cached_tokens_disk"),
            kv_load_s=data.get("kv_load_s"),
            grammar_compile_s=data.get("grammar_compile_s"),
            num_draft_tokens=data.get("num_draft_tokens"),
            num_accepted_tokens=data.get("num_accepted_tokens"),
            weights=data.get("weights"),
            kv_cache_dtype=data.get("kv_cache_dtype"),
            priority=data.get("priority"),
            backend=data.get("backend"),
            client_ttft_s=data.get("client_ttft_s"),
            client_e2e_s=data.get("client_e2e_s"),
        )


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    token_ids: list[int]  # empty when an external server answered (it does not send them)
    finish_reason: str  # "stop" | "length"
    num_prompt_tokens: int
    metrics: CompletionMetrics

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "num_prompt_tokens": self.num_prompt_tokens,
            "metrics": self.metrics.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Completion:
        """The inverse of to_json."""
        return cls(
            text=data["text"],
            token_ids=data["token_ids"],
            finish_reason=data["finish_reason"],
            num_prompt_tokens=data["num_prompt_tokens"],
            metrics=CompletionMetrics.from_json(data["metrics"]),
        )
