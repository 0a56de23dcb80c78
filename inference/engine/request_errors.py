"""RequestError: one request failed inside the engine — while sampling, applying or advancing
its grammar, detokenizing or checking its stop strings. The engine finishes that request (its
KV blocks are freed) and raises this to its caller; the requests batched with it go on.
"""

from __future__ import annotations


class RequestError(RuntimeError):
    pass
