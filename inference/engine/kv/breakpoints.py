"""Cache breakpoints: token positions where a prompt's shared head ends.

A request declares them as `SamplingParams.cache_breakpoints`, or, for chat messages, by
marking a message `"cache": True` (like Anthropic's cache_control): the end of that message in
the rendered prompt is a breakpoint. The engine keeps its cached state exactly there.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def check_breakpoints(breakpoints: list[int] | None, num_prompt_tokens: int) -> list[int]:
    """The declared positions, each in (0, num_prompt_tokens], else ValueError."""
    bad = [p for p in breakpoints or () if not 0 < p <= num_prompt_tokens]
    if bad:
        raise ValueError(
            f"cache_breakpoints {bad} fall outside the prompt: each must be in "
            f"(0, {num_prompt_tokens}] (token positions; the prompt has {num_prompt_tokens})"
        )
    return list(breakpoints or ())


def chat_breakpoints(tokenizer: Any, messages: list[dict], token_ids: list[int]) -> list[int]:
    """The end, in `token_ids` (the rendered conversation), of each message marked "cache".

    The conversation up to that message is rendered alone (no generation prompt); its text
    must start the whole rendering. Tokens may merge across the boundary, so the breakpoint is
    where the two token lists stop agreeing. A marked message whose rendering is not a prefix
    (a template that rewrites earlier turns) is dropped with a logged note.
    """
    marked = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("cache")]
    if not marked:
        return []
    whole = tokenizer.render_chat(messages, add_generation_prompt=True)
    positions = []
    for index in marked:
        head = tokenizer.render_chat(messages[: index + 1], add_generation_prompt=False)
        if not whole.startswith(head):
            logger.warning(
                "cache breakpoint after message %d dropped: the chat template renders the "
                "conversation up to it differently from the start of the whole prompt",
                index,
            )
            continue
        head_ids = tokenizer.encode(head)
        common = 0
        for a, b in zip(head_ids, token_ids, strict=False):
            if a != b:
                break
            common += 1
        if common < len(head_ids):
            logger.info(
                "cache breakpoint after message %d moved from token %d to %d: tokens merge "
                "across the message boundary",
                index,
                len(head_ids),
                common,
            )
        if common:
            positions.append(common)
    return sorted(set(positions))
