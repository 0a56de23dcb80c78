"""RequestError: one request failed inside the engine — while sampling, applying or advancing
its grammar, detokenizing or checking its stop strings. The engine finishes that request (its
KV blocks are freed) and raises this to its caller; the requests batched with it go on.
"""

from __future__ import annotations


class RequestError(RuntimeError):
    pass


def request_failed(request_id: str, exc: Exception) -> RequestError:
    """The error a request's caller gets when `exc` failed that request alone."""
    if isinstance(exc, RequestError):
        return RequestError(f"request {request_id} failed in the engine: {exc}")
    return RequestError(f"request {request_id} failed in the engine: {type(exc).__name__}: {exc}")
