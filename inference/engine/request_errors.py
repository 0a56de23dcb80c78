"""RequestError: one request failed inside the engine — while sampling, applying or advancing
its grammar, detokenizing or checking its stop strings, or before its step when its blocks do
not cover its span (RequestNotComputed). The engine finishes that request (its KV blocks are
freed) and raises this to its caller; the requests batched with it go on.
"""

from __future__ import annotations


class RequestError(RuntimeError):
    pass


class EngineShutDown(RuntimeError):
    """Work handed to an engine (a request, a grammar to compile) after it began shutting down:
    expected while a worker stops, not a fault."""

    def __init__(self) -> None:
        super().__init__("engine is shut down")


class RequestNotComputed(RequestError):
    """The runner left the request out of its step (runner/span_check.py): the step wrote none
    of its K/V, so the blocks registered for it must be forgotten, as after a failed step."""


def request_failed(request_id: str, exc: Exception) -> RequestError:
    """The error a request's caller gets when `exc` failed that request alone."""
    if isinstance(exc, RequestError):
        return RequestError(f"request {request_id} failed in the engine: {exc}")
    return RequestError(f"request {request_id} failed in the engine: {type(exc).__name__}: {exc}")
