"""Prompt prefixes as routing sees them: one key per cache breakpoint of a chat prompt, and the
keys of the prompts this process served lately (what its node's heartbeat says it holds).

A chat prompt marks the ends of its reusable sections with `"cache": True` on a message (the
engine keeps a cache breakpoint there: inference/engine/kv/breakpoints.py). The prefix up to
and including message i has the key hash(cache salt, messages[:i+1]); two prompts share that key
exactly when the engine could reuse that whole prefix for both (same salt, same text). The key
is computed from the messages, not the tokens, so the tick loop can compute it without a
tokenizer, as SGLang's router matches on text.

What a node reports is approximate, as SGLang's router tree is: the keys of the prompts it
*served* most recently, at most settings.INFERENCE_HEARTBEAT_PREFIXES of them, most recent
first. A key can outlive its blocks (the engine evicted them under pressure); it never names a
prefix the node did not compute. The engine is not asked which blocks it still holds: it has
no such read-only query, and its pool belongs to its own loop thread.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# 16 hex digits (64 bits): short in a heartbeat, and no collision among a node's few hundred.
KEY_CHARS = 16


@dataclass(frozen=True, slots=True)
class PromptPrefix:
    """A prompt's prefix up to one cache breakpoint: its key and how many characters of
    message content it covers (routing prefers the node holding the longest)."""

    key: str
    num_chars: int


def prompt_prefixes(
    messages: Sequence[dict[str, Any]], cache_salt: str | None
) -> list[PromptPrefix]:
    """The prefixes of `messages` that end at a cache breakpoint, shortest first."""
    prefixes = []
    hasher = hashlib.sha256(json.dumps(cache_salt or "").encode())
    num_chars = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        text = json.dumps(
            {"role": message.get("role"), "content": content}
            if isinstance(message, dict)
            else None,
            ensure_ascii=False,
            sort_keys=True,
        )
        # A running hash: the key of messages[:i+1] extends the key of messages[:i].
        hasher.update(text.encode())
        num_chars += len(content) if isinstance(content, str) else len(text)
        if isinstance(message, dict) and message.get("cache"):
            prefixes.append(
                PromptPrefix(key=hasher.copy().hexdigest()[:KEY_CHARS], num_chars=num_chars)
            )
    return prefixes


class ServedPrefixes:
    """The prefix keys of the prompts this process served lately, most recent first, at most
    `limit` of them (thread-safe: a worker's threads record, its heartbeat thread reads).
    `changed` is set on every record, so the heartbeat can go out at once."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"limit must be 0 or more prefixes, got {limit}")
        self.limit = limit
        self.changed = threading.Event()
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, prefixes: Sequence[PromptPrefix]) -> None:
        if not prefixes:
            return
        with self._lock:
            for prefix in prefixes:
                self._keys[prefix.key] = None
                self._keys.move_to_end(prefix.key, last=False)
            while len(self._keys) > self.limit:
                self._keys.popitem(last=True)
        self.changed.set()

    def keys(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._keys)

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()


class _ServedSlot:
    """This process's one ServedPrefixes, made on first use with the configured limit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._served: ServedPrefixes | None = None

    def get(self) -> ServedPrefixes:
        with self._lock:
            if self._served is None:
                from django.conf import settings

                self._served = ServedPrefixes(settings.INFERENCE_HEARTBEAT_PREFIXES)
            return self._served


_slot = _ServedSlot()


def served_prefixes() -> ServedPrefixes:
    """The prefixes this process's engine served (the node worker's heartbeat reports them)."""
    return _slot.get()
