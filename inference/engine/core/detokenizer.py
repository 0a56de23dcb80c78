"""Incremental detokenization for streaming: the text new tokens add, once it is safe to show.

Text is shown only when it can no longer change. A token that ends mid-character (byte-level BPE
splits UTF-8 sequences across tokens) decodes to a trailing U+FFFD: held until the character is
complete. Text that could be the start of a stop string is held until it is clearly not one
(then shown) or is one (then cut, as RequestOutput.text is cut). So the deltas never show a stop
string or half of one, and they add up exactly to the final output text.

It decodes the whole output each time, so the text always equals what the engine's final decode
gives; that costs O(n) per call, and the caller calls once per batch of new tokens, not per step.
"""

from __future__ import annotations

import logging
from typing import Protocol

logger = logging.getLogger(__name__)


class _Decoder(Protocol):
    def decode(self, ids: list[int]) -> str: ...


def stop_cut(text: str, stop: list[str]) -> tuple[str, bool]:
    """`text` cut before the earliest stop string in it, and whether one was found."""
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


def _stop_prefix_len(text: str, stop: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    longest = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest


class IncrementalDetokenizer:
    def __init__(self, tokenizer: _Decoder, stop: list[str]) -> None:
        self._tokenizer = tokenizer
        self._stop = list(stop)
        self._token_ids: list[int] = []
        self.text_sent = ""

    def add(self, token_ids: list[int]) -> str:
        """Take newly sampled tokens; return the text now safe to show ("" if none yet)."""
        self._token_ids.extend(token_ids)
        text, stopped = stop_cut(self._tokenizer.decode(self._token_ids), self._stop)
        if not stopped:
            text = text.rstrip("\ufffd")  # an unfinished character; a later token completes it
            text = text[: len(text) - _stop_prefix_len(text, self._stop)]
        return self._advance(text)

    def finish(self, final_text: str) -> str:
        """The rest of the output once the request finished (`final_text`: RequestOutput.text)."""
        return self._advance(final_text)

    def _advance(self, text: str) -> str:
        if not text.startswith(self.text_sent):
            # Cannot happen with prefix-stable decoders (byte-level BPE); text already shown
            # cannot be taken back, so say so rather than send a garbled stream silently.
            logger.warning("streamed text diverged from the decoded text; sending the rest")
        if len(text) <= len(self.text_sent):
            return ""
        delta, self.text_sent = text[len(self.text_sent) :], text
        return delta
