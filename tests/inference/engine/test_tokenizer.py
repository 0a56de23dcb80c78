"""The GGUF-built tokenizer: a tiny hand-made vocabulary for exact behaviour, and the real
SmolLM2 file checked id for id against transformers' own GGUF tokenizer."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

import jinja2
import pytest
from tokenizers.pre_tokenizers import ByteLevel

from inference.engine.loading.tokenizer import Tokenizer

# --- a tiny byte-level vocabulary ----------------------------------------------------------

_TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_TINY_MERGES = ["h e", "l l", "he ll", "Ġ w", "4 2"]
_TINY_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_metadata(**overrides: Any) -> dict[str, Any]:
    tokens = [*_TINY_SPECIALS, *sorted(ByteLevel.alphabet())]
    tokens += ["".join(merge.split(" ")) for merge in _TINY_MERGES]
    metadata = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": _TINY_MERGES,
        "tokenizer.ggml.token_type": [3] * len(_TINY_SPECIALS) + [1] * (len(tokens) - 3),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 0,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": _TINY_TEMPLATE,
    }
    metadata.update(overrides)
    return metadata


@pytest.fixture
def tiny() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(tiny_metadata())


def ids_of(tokenizer: Tokenizer, *tokens: str) -> list[int]:
    return [tokenizer.vocab.index(token) for token in tokens]


def test_merges_apply_and_specials_stay_whole(tiny: Tokenizer) -> None:
    ids = tiny.encode("hello world<|im_end|>42")
    assert ids == ids_of(tiny, "hell", "o", "Ġw", "o", "r", "l", "d", "<|im_end|>", "4", "2")
    assert tiny.decode(ids) == "hello world42"
    assert tiny.decode(ids, skip_special_tokens=False) == "hello world<|im_end|>42"


def test_smollm_splits_every_digit_where_gpt2_would_merge_them() -> None:
    smollm = Tokenizer.from_gguf_metadata(tiny_metadata())
    gpt2 = Tokenizer.from_gguf_metadata(tiny_metadata(**{"tokenizer.ggml.pre": "gpt2"}))
    assert smollm.encode("x42") == ids_of(smollm, "x", "4", "2")
    assert gpt2.encode("x42") == ids_of(gpt2, "x", "42")


def test_a_special_token_cut_short_is_plain_text(tiny: Tokenizer) -> None:
    assert tiny.encode("<|im_end") == ids_of(tiny, "<", "|", "i", "m", "_", "e", "n", "d")


def test_stop_ids_are_eos_plus_the_templates_end_of_turn(tiny: Tokenizer) -> None:
    assert tiny.eos_token_id == 0
    assert tiny.stop_token_ids == frozenset({0, 2})
    no_template = tiny_metadata()
    del no_template["tokenizer.chat_template"]
    assert Tokenizer.from_gguf_metadata(no_template).stop_token_ids == frozenset({0})


def test_add_special_tokens_adds_bos_only_when_the_gguf_asks(tiny: Tokenizer) -> None:
    assert tiny.encode("he", add_special_tokens=True) == ids_of(tiny, "he")
    with_bos = Tokenizer.from_gguf_metadata(tiny_metadata(**{"tokenizer.ggml.add_bos_token": True}))
    assert with_bos.encode("he", add_special_tokens=True) == [1, *ids_of(tiny, "he")]
    assert with_bos.encode("he") == ids_of(tiny, "he")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tokenizer.ggml.model": "t5"}, "unsupported tokenizer.ggml.model 't5'"),
        ({"tokenizer.ggml.model": "llama"}, "(SentencePiece) is supported for"),
        ({"tokenizer.ggml.model": None}, "unsupported tokenizer.ggml.model None"),
        ({"tokenizer.ggml.pre": "qwen2"}, "unsupported tokenizer.ggml.pre 'qwen2'"),
        ({"tokenizer.ggml.merges": []}, "lacks tokenizer.ggml.merges"),
        ({"tokenizer.ggml.merges": ["abc"]}, "is not two tokens"),
        ({"tokenizer.ggml.eos_token_id": None}, "lacks tokenizer.ggml.eos_token_id"),
        ({"tokenizer.ggml.eos_token_id": 10**6}, "is not a token id below"),
        ({"tokenizer.ggml.token_type": [3]}, "tokenizer.ggml.token_type has 1 entries"),
        ({"tokenizer.chat_template": "{% for %}"}, "not valid jinja2"),
    ],
)
def test_bad_metadata_is_rejected(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Tokenizer.from_gguf_metadata(tiny_metadata(**overrides))


@pytest.mark.parametrize("bad_ids", [[10**6], [-1], ["a"]])
def test_decode_rejects_what_is_not_a_token_id(tiny: Tokenizer, bad_ids: list) -> None:
    with pytest.raises(ValueError, match="decode"):
        tiny.decode(bad_ids)


def test_encode_rejects_non_text(tiny: Tokenizer) -> None:
    with pytest.raises(ValueError, match="takes a str"):
        tiny.encode(b"hello")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ({"role": "user", "content": "hi"}, "must be a list"),
        ((("role", "user"),), "must be a list"),
        ([], "empty"),
        (["hi"], r"messages\[0\] must be a dict"),
        ([{"role": "tool", "content": "hi"}], r"messages\[0\]\['role'\] must be one of"),
        ([{"content": "hi"}], "role"),
        ([{"role": "user", "content": None}], r"messages\[0\]\['content'\] must be a str"),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": 3}], r"messages\[1\]"),
    ],
)
def test_bad_messages_are_rejected(tiny: Tokenizer, messages: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny.render_chat(messages)


def test_extra_message_keys_are_ignored(tiny: Tokenizer) -> None:
    plain = [{"role": "user", "content": "hi"}]
    marked = [{"role": "user", "content": "hi", "cache": True}]
    assert tiny.render_chat(marked) == tiny.render_chat(plain)
    assert tiny.render_chat(plain) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tiny.apply_chat_template(plain, add_generation_prompt=False) == tiny.encode(
        "<|im_start|>user\nhi<|im_end|>\n"
    )


def test_templates_render_like_transformers_renders_them() -> None:
    template = (
        "{{ bos_token }}{% for message in messages %}\n"
        "    {{ message['content'] | tojson }}\n"
        "  {% endfor %}{{ eos_token }}"
    )
    tokenizer = Tokenizer.from_gguf_metadata(tiny_metadata(**{"tokenizer.chat_template": template}))
    # trim_blocks eats the newline after a block tag, lstrip_blocks the indent before one;
    # tojson keeps non-ASCII and "<" as they are.
    messages = [{"role": "user", "content": "<喫茶>"}]
    assert tokenizer.render_chat(messages) == '<|im_start|>    "<喫茶>"\n<|endoftext|>'


def test_the_template_can_reject_a_conversation() -> None:
    template = (
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}"
    )
    tokenizer = Tokenizer.from_gguf_metadata(tiny_metadata(**{"tokenizer.chat_template": template}))
    with pytest.raises(ValueError, match="rejected the messages: system first"):
        tokenizer.render_chat([{"role": "user", "content": "hi"}])


def test_the_template_runs_sandboxed() -> None:
    template = "{{ messages.append(1) }}"
    tokenizer = Tokenizer.from_gguf_metadata(tiny_metadata(**{"tokenizer.chat_template": template}))
    with pytest.raises(jinja2.exceptions.SecurityError):
        tokenizer.render_chat([{"role": "user", "content": "hi"}])


def test_no_chat_template_says_so() -> None:
    metadata = tiny_metadata()
    del metadata["tokenizer.chat_template"]
    with pytest.raises(ValueError, match=r"no tokenizer\.chat_template"):
        Tokenizer.from_gguf_metadata(metadata).render_chat([{"role": "user", "content": "hi"}])


# --- the real SmolLM2 tokenizer against transformers ---------------------------------------

CORPUS = {
    "english": "The quick brown fox jumps over the lazy dog. Isn't it? We'll see, they're done.",
    "japanese": "ぽこまち、喫茶店でコーヒーを飲みます。今日は晴れ！",
    "digits": "12345 3.14 -0.5e10 2026-12-02 1,000,000",
    "code": 'def f(x):\n    return {"a": [x ** 2, None]}  # comment\n\tif x: pass\n',
    "whitespace_runs": "a  b   c    d\t\t e \u3000 f     ",
    "leading_spaces": "   leading and trailing   ",
    "newlines": "line1\nline2\n\n\nline5\r\nline6\n",
    "emoji": "🐱 cats 👩‍👩‍👧 🇯🇵 ok👍🏽",
    "json": '{"action": "go_to", "target": "喫茶店", "reason": "coffee", "n": 3, "ok": true}',
    "specials": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "specials_glued": "a<|im_start|>b<|im_end|><|im_end|> <|endoftext|> <|im_start",
    "empty": "",
}

CHATS = {
    "user_only": [{"role": "user", "content": "What should I do next?"}],
    "with_system": [
        {"role": "system", "content": "You are a resident of a small town.", "cache": True},
        {"role": "user", "content": "Where do you go at 9:00?"},
    ],
    "multi_turn": [
        {"role": "system", "content": "Answer in JSON."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": '{"action": "wave"}'},
        {"role": "user", "content": "And now?"},
    ],
    "japanese": [
        {"role": "system", "content": "あなたはぽこまちの住人です。"},
        {"role": "user", "content": "喫茶店は10時に開きます。次は何をしますか？"},
    ],
}


@pytest.fixture(scope="module")
def tokenizer(smollm2_metadata: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(smollm2_metadata)


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_gguf_path):
    transformers = pytest.importorskip("transformers")
    path = smollm2_gguf_path
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def hf_chat_ids(hf_tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    result = hf_tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True
    )
    # transformers 5 returns a BatchEncoding here; 4.x returned the ids.
    return list(result["input_ids"] if isinstance(result, Mapping) else result)


@pytest.mark.real_model
@pytest.mark.parametrize("text", CORPUS.values(), ids=CORPUS.keys())
def test_ids_match_transformers(tokenizer: Tokenizer, hf_tokenizer, text: str) -> None:
    assert tokenizer.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.encode(text, add_special_tokens=True) == hf_tokenizer.encode(text)


@pytest.mark.real_model
@pytest.mark.parametrize("text", CORPUS.values(), ids=CORPUS.keys())
def test_decode_round_trips_and_matches_transformers(
    tokenizer: Tokenizer, hf_tokenizer, text: str
) -> None:
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert tokenizer.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)
    if "<|" not in text:
        assert tokenizer.decode(ids) == text


@pytest.mark.real_model
def test_specials_are_single_ids(tokenizer: Tokenizer) -> None:
    assert tokenizer.encode("<|im_start|><|im_end|><|endoftext|>") == [1, 2, 0]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    assert tokenizer.stop_token_ids == frozenset({2})
    assert tokenizer.decode(tokenizer.encode("<|im_start|>user\nhi<|im_end|>")) == "user\nhi"


@pytest.mark.real_model
def test_vocab_is_the_byte_level_spelling(tokenizer: Tokenizer, hf_tokenizer) -> None:
    assert tokenizer.vocab_type == "byte_level"
    assert tokenizer.vocab_size == len(tokenizer.vocab) == 49152
    assert tokenizer.vocab == hf_tokenizer.convert_ids_to_tokens(list(range(49152)))
    assert tokenizer.vocab[tokenizer.encode(" world")[0]] == "Ġworld"


@pytest.mark.real_model
@pytest.mark.parametrize("messages", CHATS.values(), ids=CHATS.keys())
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(
    tokenizer: Tokenizer, hf_tokenizer, messages: list[dict], add_generation_prompt: bool
) -> None:
    text = tokenizer.render_chat(messages, add_generation_prompt=add_generation_prompt)
    assert text == hf_tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    assert tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt
    ) == hf_chat_ids(hf_tokenizer, messages, add_generation_prompt)


@pytest.mark.real_model
def test_default_system_prompt_comes_from_the_template(tokenizer: Tokenizer) -> None:
    text = tokenizer.render_chat(CHATS["user_only"])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>assistant\n")


@pytest.mark.real_model
def test_building_takes_well_under_a_second(smollm2_metadata: dict[str, Any]) -> None:
    start = time.perf_counter()
    Tokenizer.from_gguf_metadata(smollm2_metadata)
    assert time.perf_counter() - start < 1.0
