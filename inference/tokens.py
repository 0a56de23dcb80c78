"""Token counts for display (the admin's prompt view), with a model's own tokenizer.

Loads only the tokenizer and chat template from the model's GGUF metadata, never the weights,
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
def _tokenizer_for_file(path: str) -> Tokenizer:
    from inference.engine.loading.gguf_file import open_gguf, read_metadata
    from inference.engine.loading.tokenizer import Tokenizer

    return Tokenizer.from_gguf_metadata(read_metadata(open_gguf(path)))


def tokenizer_for(model: str) -> Tokenizer:
    """`model`'s tokenizer (a bundled model name or a .gguf path); ValueError if unknown."""
    from inference.engine.loading.model_files import gguf_path_for

    path = str(gguf_path_for(model))
    with _lock:
        return _tokenizer_for_file(path)


def chat_token_counts(
    *, model: str, messages: list[dict[str, Any]], num_head_messages: int
) -> tuple[int, int]:
    """(tokens of the first `num_head_messages` messages, tokens of the whole prompt with the
    generation prompt), as the model's chat template renders them."""
    tokenizer = tokenizer_for(model)
    head = messages[:num_head_messages]
    num_head = len(tokenizer.apply_chat_template(head, add_generation_prompt=False)) if head else 0
    return num_head, len(tokenizer.apply_chat_template(messages))
