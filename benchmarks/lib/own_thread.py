"""Run a piece of the benchmark's own torch work on a thread of its own, which then ends.

Each thread that runs a multi-threaded torch op keeps a libgomp team of worker threads for
as long as it lives. With the engine thread's team and one more than the CPUs can hold,
libgomp stops spinning between parallel regions and every op of the engine waits for its
workers to wake (LLMEngine._run_engine_thread). The bench's main thread lives through every
run, so what it measures itself (the floor, the transformers baseline) runs here instead:
the thread's team goes when the thread does, and the next engine steps at full speed.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from threading import Thread
from typing import TypeVar

T = TypeVar("T")


def in_own_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs) on a new thread, waited for; its exception is raised here."""
    done: Future[T] = Future()

    def run() -> None:
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            done.set_exception(exc)

    thread = Thread(target=run, name="bench-own-thread")
    thread.start()
    thread.join()
    return done.result()
