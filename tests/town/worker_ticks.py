"""Helpers for tests that run ticks against real worker processes (test_tasks,
test_routing_nodes): waiting on a condition, and a tick run in a thread of its own."""

from __future__ import annotations

import threading
import time

from town.models import Run, Tick
from town.simulation import tick_run
from town.tasks import decision_send


def wait_for(condition, what: str, timeout_s: float = 120, poll_s: float = 0.01) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(poll_s)


def tick(run: Run, poll_s: float = 0.05) -> Tick:
    """One tick of `run`, its decisions sent to the workers."""
    return tick_run(run_id=run.pk, send=decision_send, owner="test", poll_s=poll_s)


def tick_in_background(run: Run, poll_s: float = 0.05) -> tuple[threading.Thread, dict]:
    """A tick in a thread; its Tick (or the exception it raised) lands in the dict."""
    result: dict = {}

    def run_tick() -> None:
        from django.db import connection

        try:
            result["tick"] = tick(run, poll_s)
        except Exception as exc:  # re-raised in the test's thread
            result["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run_tick, daemon=True)
    thread.start()
    return thread, result
