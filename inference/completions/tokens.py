"""Token counts for display (the admin's prompt view), with a model's own tokenizer.

Loads only the tokenizer and chat template (GGUF metadata or tokenizer.json), never the weights,
once per process per model; the first call takes seconds (it imports the engine package, so
torch), later ones microseconds. The engine's own counts stay the source of truth for metrics.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference.engine.loading.tokenizer import Tokenizer

_lock = threading.Lock()


@functools.cache
def _tokenizer_for_model(model: str) -> Tokenizer:
    from inference.engine.models import load_tokenizer

    return load_tokenizer(model)


def tokenizer_for(model: str) -> Tokenizer:
    """`model`'s tokenizer (a bundled or generated model name, a .gguf path or a checkpoint
    directory); ValueError if unknown."""
    with _lock:
        return _tokenizer_for_model(model)


def chat_token_counts(
    *, model: str, messages: list[dict[str, Any]], num_head_messages: int
) -> tuple[int, int]:
    """(tokens of the first `num_head_messages` messages, tokens of the whole prompt with the
    generation prompt), as the model's chat template renders them."""
    tokenizer = tokenizer_for(model)
    head = messages[:num_head_messages]
    num_head = len(tokenizer.apply_chat_template(head, add_generation_prompt=False)) if head else 0
    return num_head, len(tokenizer.apply_chat_template(messages))
