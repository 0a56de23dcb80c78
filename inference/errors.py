"""Errors the inference app raises for input it cannot serve; each message says how to fix it."""


class InferenceError(Exception):
    """Base of the inference app's errors."""


class UnknownNodeError(InferenceError):
    """A node name that is not configured (settings.INFERENCE_NODES, env POKOMACHI_NODES)."""


class CompletionInputError(InferenceError):
    """A completion request the engine cannot serve: bad messages, limits or schema."""


class CompletionTimeoutError(InferenceError):
    """A completion that did not finish within its deadline; the engine aborted it."""


class CompileLimitError(InferenceError):
    """A schema compile that would exceed its caller's share of the node's compiles (429):
    `retry_after_s` is when to try again."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
