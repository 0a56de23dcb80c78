"""Errors the inference app raises for input it cannot serve; each message says how to fix it."""


class InferenceError(Exception):
    """Base of the inference app's errors."""


class UnknownNodeError(InferenceError):
    """A node name that is not configured (settings.INFERENCE_NODES, env POKOMACHI_NODES)."""


class CompletionInputError(InferenceError):
    """A completion request the engine cannot serve: bad messages, limits or schema."""


class CompletionTimeoutError(InferenceError):
    """A completion that did not finish within its deadline; the engine aborted it."""
