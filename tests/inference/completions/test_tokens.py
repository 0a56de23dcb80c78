"""The admin's token counts come from each model's own tokenizer: GGUF models and checkpoint
directories alike (deepseek-v4-tiny-random's is SmolLM2's tokenizer.json), never the weights."""

from __future__ import annotations

import pytest

from inference.completions.tokens import chat_token_counts, tokenizer_for

MESSAGES = [
    {"role": "system", "content": "You live in Pokomachi."},
    {"role": "user", "content": "Where do you go this morning?"},
]


def test_a_checkpoint_models_counts_come_from_its_tokenizer_json():
    head, total = chat_token_counts(
        model="deepseek-v4-tiny-random", messages=MESSAGES, num_head_messages=1
    )
    smollm2 = chat_token_counts(model="smollm2-tiny-random", messages=MESSAGES, num_head_messages=1)
    assert 0 < head < total and (head, total) == smollm2  # the same tokenizer and template
    assert tokenizer_for("deepseek-v4-tiny-random").vocab_size == 49152


def test_an_unknown_model_is_a_value_error_saying_which_exist():
    with pytest.raises(ValueError, match="deepseek-v4-tiny-random"):
        tokenizer_for("no-such-model")
