"""SamplingParams: how one request is decoded. Validated on construction."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

# A temperature below this samples greedily (dividing logits by 1e-300 gives ±inf and NaN).
GREEDY_BELOW = 1e-5


def _finite(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def _whole(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: list[str] | str | None = None
    ignore_eos: bool = False
    json_schema: dict[str, Any] | str | None = None
    cache_salt: str | None = None
    # Token positions in the prompt where the cached state is kept exactly (a shared head ends
    # there), like Anthropic's cache_control; each in (0, prompt length], checked per prompt.
    cache_breakpoints: list[int] | None = None
    stop_list: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        _whole("max_tokens", self.max_tokens)
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer ≥ 1, got {self.max_tokens!r}")
        _finite("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be ≥ 0 (0 = greedy), got {self.temperature}")
        _finite("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _whole("top_k", self.top_k)
        if self.top_k < 0:
            raise ValueError(f"top_k must be ≥ 0 (0 = off), got {self.top_k}")
        if self.seed is not None:
            _whole("seed", self.seed)
        if isinstance(self.stop, str):
            self.stop_list = [self.stop]
        elif self.stop is None:
            self.stop_list = []
        else:
            self.stop_list = list(self.stop)
        if any(not isinstance(s, str) or not s for s in self.stop_list):
            raise ValueError("stop must be a non-empty string or a list of non-empty strings")
        if self.cache_breakpoints is not None:
            if not isinstance(self.cache_breakpoints, (list, tuple)) or any(
                isinstance(p, bool) or not isinstance(p, int) or p < 1
                for p in self.cache_breakpoints
            ):
                raise ValueError(
                    "cache_breakpoints must be a list of token positions (ints ≥ 1, at most the "
                    f"prompt length), got {self.cache_breakpoints!r}"
                )
            self.cache_breakpoints = sorted(set(self.cache_breakpoints))
        if self.json_schema is not None and not isinstance(self.json_schema, (dict, str)):
            raise ValueError("json_schema must be a dict or a JSON string")

    @property
    def is_greedy(self) -> bool:
        """Below GREEDY_BELOW the logits would be divided into overflow: argmax is what such a
        temperature means."""
        return self.temperature < GREEDY_BELOW

    def json_schema_text(self) -> str | None:
        if self.json_schema is None:
            return None
        if isinstance(self.json_schema, str):
            return self.json_schema
        return json.dumps(self.json_schema)
