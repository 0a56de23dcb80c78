"""What a request gives its caller: once it finishes, its RequestOutput (the tokens detokenized,
stop strings cut, its metrics) or the error that failed it; while it runs, the text its tokens
add (generate_stream), as vLLM's v1/engine/output_processor.py. `Deadline` is the caller's
`timeout`, which bounds both waits.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING

from inference.engine.core.detokenizer import IncrementalDetokenizer, stop_cut
from inference.engine.outputs import RequestOutput, StreamDelta
from inference.engine.request import Request
from inference.engine.request_errors import request_failed

if TYPE_CHECKING:
    from inference.engine.loading.tokenizer import Tokenizer


class Deadline:
    """A caller's `timeout` in seconds (None: none), counted from when this is made."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.at = None if timeout is None else time.monotonic() + timeout

    def left(self) -> float | None:
        return None if self.at is None else max(self.at - time.monotonic(), 0.0)

    def error(self) -> TimeoutError:
        return TimeoutError(
            f"the completion did not finish within {self.timeout:g} s; it was aborted and its "
            "KV blocks freed"
        )


class OutputProcessor:
    """Finished requests to their callers' futures, and streams opened for running ones."""

    def __init__(self, tokenizer: Tokenizer | None, weights: str, kv_cache_dtype: str) -> None:
        self.tokenizer = tokenizer
        # What every request's metrics report ("auto" resolved at load).
        self.weights = weights
        self.kv_cache_dtype = kv_cache_dtype

    def deliver(self, request: Request, future: Future) -> None:
        """A finished request's output to its caller, or the error that failed it alone."""
        if request.error is None:
            try:
                future.set_result(self.make_output(request))
                return
            except Exception as exc:  # detokenizing this request's tokens
                request.error = request_failed(request.request_id, exc)
        future.set_exception(request.error)

    def make_output(self, request: Request) -> RequestOutput:
        decoded = self.tokenizer.decode(request.output_token_ids) if self.tokenizer else ""
        text, _ = stop_cut(decoded, request.sampling_params.stop_list)
        return RequestOutput(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=list(request.output_token_ids),
            text=text,
            finish_reason=request.status.value,
            metrics=request.metrics(self.weights, self.kv_cache_dtype),
        )

    def open_stream(self, request: Request) -> RequestStream:
        """Take the request's tokens as they are sampled; open it before the request is
        submitted, so no token is missed."""
        return RequestStream(request, self.tokenizer)


class RequestStream:
    """One request's sampled tokens on their way to its caller, as text deltas."""

    def __init__(self, request: Request, tokenizer: Tokenizer | None) -> None:
        self.request_id = request.request_id
        self.sampled: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        request.on_token = self.sampled.put  # on the loop thread, as each token is sampled
        # A checkpoint without a tokenizer streams token ids with empty text.
        stop = request.sampling_params.stop_list
        self.detokenizer = IncrementalDetokenizer(tokenizer, stop) if tokenizer else None

    def deltas(self, future: Future[RequestOutput], deadline: Deadline) -> Iterator[StreamDelta]:
        """The text the tokens add as they come, then a last delta carrying the output. Raises
        what failed the request, or TimeoutError past the deadline."""
        # Runs after the last on_token on the loop thread (or at once if already done).
        future.add_done_callback(lambda _: self.sampled.put(None))
        detokenizer = self.detokenizer
        while (token := self._next_token(deadline)) is not None:
            token_ids = [token]
            while not self.sampled.empty():  # take what piled up, decode once
                if (more := self.sampled.get()) is None:
                    self.sampled.put(None)
                    break
                token_ids.append(more)
            text = detokenizer.add(token_ids) if detokenizer else ""
            if text or detokenizer is None:
                yield StreamDelta(text, token_ids, request_id=self.request_id)
        output = future.result()  # raises what failed the request
        text = detokenizer.finish(output.text) if detokenizer else ""
        yield StreamDelta(text, output=output, request_id=self.request_id)

    def _next_token(self, deadline: Deadline) -> int | None:
        try:
            return self.sampled.get(timeout=deadline.left())
        except queue.Empty:
            raise deadline.error() from None
