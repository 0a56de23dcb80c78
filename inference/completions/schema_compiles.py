"""A node's JSON-schema compiles: started off the threads that serve requests, bounded per caller.

A completion whose schema this node has not compiled must not wait for the compile on one of
the worker's few threads (a slow but legal schema takes tens of seconds; a few at once would
queue every other request of the node behind them). `schema_compile_pending` starts the compile
on the engine's compile threads (LLMEngine.compile_schema_async) and returns its future: the
task hands its thread back and is sent again once the compile is done (inference/tasks.py).
A schema compiled, refused or under way already costs nothing and is never refused here.

Each caller (a /v1 identity; the town passes none and is not bounded) may start at most
settings.OPENAI_MAX_COMPILES_PER_IDENTITY compiles on a node at once, and spend at most
settings.GRAMMAR_COMPILE_CPU_S_PER_IDENTITY seconds of compile in any
GRAMMAR_COMPILE_WINDOW_S. A compile's seconds are counted by the clock on its compile worker
(each compile runs on one thread, so this is at least its CPU time), when it ends; a schema
past the deadline (grammar_compile_timeout_s) costs the deadline. What would exceed a share is
refused with CompileLimitError (429) saying which limit and when to retry.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any

from django.conf import settings

from inference.completions.remote import remote_is_configured
from inference.completions.runtime import engine_get
from inference.errors import CompileLimitError

RETRY_AFTER_COMPILING_S = 5  # a compile under way ends within the deadline; most much sooner


class CompileShares:
    """Per caller: compiles under way, and the seconds of those that ended in the window."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._num_compiling: dict[str, int] = {}
        self._spent: dict[str, deque[tuple[float, float]]] = {}  # (ended at, seconds)

    def admit(self, identity: str, *, max_compiles: int, budget_s: float, window_s: float) -> None:
        """Count one more compile of `identity` as under way, or refuse it (CompileLimitError)
        when it has `max_compiles` under way or spent `budget_s` in the last `window_s`
        (0: that limit is off)."""
        with self._lock:
            num_compiling = self._num_compiling.get(identity, 0)
            if max_compiles and num_compiling >= max_compiles:
                raise CompileLimitError(
                    f"too many JSON schemas compiling for this caller: {max_compiles} at most at "
                    "once on a node (OPENAI_MAX_COMPILES_PER_IDENTITY, POKOMACHI_OPENAI_MAX_"
                    "COMPILES); wait for one to finish, then retry (a schema compiled once is "
                    "not compiled again)",
                    retry_after_s=RETRY_AFTER_COMPILING_S,
                )
            spent = self._spent_in_window(identity, window_s)
            if budget_s and sum(seconds for _, seconds in spent) >= budget_s:
                raise CompileLimitError(
                    f"this caller's JSON schemas took {budget_s:g} s of compile time in the last "
                    f"{window_s:g} s, its share on a node (GRAMMAR_COMPILE_CPU_S_PER_IDENTITY, "
                    "POKOMACHI_GRAMMAR_COMPILE_CPU_S): retry later, reuse schemas (a schema "
                    "compiled once is free), or simplify them",
                    retry_after_s=self._retry_after(spent, budget_s, window_s),
                )
            self._num_compiling[identity] = num_compiling + 1

    def settle(self, identity: str, compile_s: float) -> None:
        """An admitted compile ended (or never started: 0 s)."""
        with self._lock:
            self._num_compiling[identity] -= 1
            if not self._num_compiling[identity]:
                del self._num_compiling[identity]
            if compile_s > 0:
                self._spent.setdefault(identity, deque()).append((self._clock(), compile_s))

    def num_compiling(self, identity: str) -> int:
        with self._lock:
            return self._num_compiling.get(identity, 0)

    def _spent_in_window(self, identity: str, window_s: float) -> deque[tuple[float, float]]:
        spent = self._spent.get(identity, deque())
        while spent and spent[0][0] <= self._clock() - window_s:
            spent.popleft()
        if not spent:
            self._spent.pop(identity, None)
        return spent

    def _retry_after(
        self, spent: deque[tuple[float, float]], budget_s: float, window_s: float
    ) -> int:
        """Seconds until enough of the spent time leaves the window to be under budget."""
        total = sum(seconds for _, seconds in spent)
        for ended_at, seconds in spent:
            total -= seconds
            if total < budget_s:
                return max(1, math.ceil(ended_at + window_s - self._clock()))
        return max(1, math.ceil(window_s))


# This process's node: its compile workers are the engine's, one per process (runtime.py).
_shares = CompileShares()


def compile_shares() -> CompileShares:
    return _shares


def schema_compile_pending(
    *, json_schema: dict[str, Any] | None, identity: str | None
) -> Future | None:
    """None when a completion with this schema can run now: no schema, or one this node has
    compiled or refused (the completion then says why). Else a future, done once the schema's
    compile is: one under way already, or one started now on the engine's compile threads,
    counted against `identity`'s share (None: not bounded); CompileLimitError when that share
    would be exceeded."""
    if json_schema is None or remote_is_configured():
        return None
    engine = engine_get()
    if identity is None or engine.is_schema_known(json_schema):
        future, _ = engine.compile_schema_async(json_schema)
        return None if future.done() else future
    _shares.admit(
        identity,
        max_compiles=settings.OPENAI_MAX_COMPILES_PER_IDENTITY,
        budget_s=settings.GRAMMAR_COMPILE_CPU_S_PER_IDENTITY,
        window_s=settings.GRAMMAR_COMPILE_WINDOW_S,
    )
    try:
        future, is_started = engine.compile_schema_async(json_schema)
    except BaseException:
        _shares.settle(identity, 0.0)
        raise
    if not is_started:  # another caller started it meanwhile
        _shares.settle(identity, 0.0)
    else:
        future.add_done_callback(lambda done: _shares.settle(identity, _compile_s(done)))
    return None if future.done() else future


def _compile_s(done: Future) -> float:
    return 0.0 if done.exception() is not None else done.result().compile_s
