"""How an external OpenAI-compatible server takes a JSON schema: its dialect.

Servers that speak OpenAI's protocol disagree on structured output:
- "json_schema": OpenAI's `response_format: {"type": "json_schema", "json_schema": {...}}`
  (OpenAI, vLLM, SGLang, our own /v1);
- "json_object": `response_format: {"type": "json_object", "schema": ...}` (llama-cpp-python's
  server, which answers 500 to the first);
- "guided_json": vLLM's `guided_json` field (its older versions);
- "unconstrained": none of them.

In every dialect the answer is checked against the schema and asked for again a bounded number of
times (remote.py): a server that takes a constraint may still end an answer early.

A server's dialect is learned on its first structured request (each tried in this order until one
is not refused) and remembered per base URL for the life of the process; the log says which one.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger(__name__)

DIALECTS = ("json_schema", "json_object", "guided_json", "unconstrained")
# Answers that may be asked for, in any dialect, before the last one is kept though it does not
# follow the schema (remote.py checks each).
MAX_ANSWER_TRIES = 3
# Statuses that say nothing about the dialect: the key, the rate, the model are wrong whatever
# the constraint looks like, so no other dialect is tried.
NOT_A_DIALECT_STATUS = frozenset({401, 403, 404, 408, 429})


def dialect_apply(body: dict[str, Any], dialect: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The request `body` (the openai client's create() keywords) constrained to `schema` the
    way `dialect` says."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown structured-output dialect {dialect!r}; one of {DIALECTS}")
    body = dict(body)
    if dialect == "json_schema":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "decision", "schema": schema},
        }
    elif dialect == "json_object":
        body["response_format"] = {"type": "json_object", "schema": schema}
    elif dialect == "guided_json":
        body["extra_body"] = {**body.get("extra_body", {}), "guided_json": schema}
    return body


class DialectMemory:
    """Each server's dialect, once learned (thread-safe; one per process: dialect_memory)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_server: dict[str, str] = {}

    def get(self, server: str) -> str | None:
        with self._lock:
            return self._by_server.get(server)

    def candidates(self, server: str) -> tuple[str, ...]:
        """The dialects to try for `server`: its own once known, else all, in order."""
        known = self.get(server)
        return (known,) if known is not None else DIALECTS

    def learn(self, server: str, dialect: str) -> None:
        with self._lock:
            is_new = self._by_server.get(server) != dialect
            self._by_server[server] = dialect
        if is_new:
            logger.info("%s takes JSON schemas as %s: using it from now on", server, dialect)

    def forget(self, server: str | None = None) -> None:
        with self._lock:
            if server is None:
                self._by_server.clear()
            else:
                self._by_server.pop(server, None)


_memory = DialectMemory()


def dialect_memory() -> DialectMemory:
    return _memory
