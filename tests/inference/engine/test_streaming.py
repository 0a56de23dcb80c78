"""Streaming: the incremental detokenizer (multi-byte characters, stop strings) and
LLMEngine.generate_stream on the tiny model (real tokenizer): deltas arrive while the request
runs and add up to exactly what `generate` returns."""

from __future__ import annotations

import uuid

import pytest

from inference.engine import SamplingParams
from inference.engine.core.detokenizer import IncrementalDetokenizer, stop_cut


def _feed_one_by_one(tokenizer, token_ids, stop, final_text):
    """Deltas from feeding tokens one at a time; checks every partial stream on the way."""
    detokenizer = IncrementalDetokenizer(tokenizer, stop)
    shown = ""
    deltas = []
    for token in token_ids:
        delta = detokenizer.add([token])
        assert "\ufffd" not in delta
        shown += delta
        deltas.append(delta)
        # Nothing shown is ever taken back: every partial stream is a prefix of the final text.
        assert final_text.startswith(shown), (shown, final_text)
    deltas.append(detokenizer.finish(final_text))
    return deltas


def test_multi_byte_characters_are_never_split(tiny_engine):
    tokenizer = tiny_engine.tokenizer
    text = "パン屋 opens at 7 🍞🥐 — café crème, 喫茶店 Komorebi 🌸"
    token_ids = tokenizer.encode(text)
    assert tokenizer.decode(token_ids) == text
    # Byte-level BPE splits these characters: some token prefixes end mid-character.
    assert any(tokenizer.decode(token_ids[:n]).endswith("\ufffd") for n in range(len(token_ids)))
    deltas = _feed_one_by_one(tokenizer, token_ids, [], text)
    assert "".join(deltas) == text
    assert sum(1 for d in deltas if d) >= 10


def test_stop_strings_never_leak_even_in_part(tiny_engine):
    tokenizer = tiny_engine.tokenizer
    text = "The bakery opens at seven, the park at eight."
    token_ids = tokenizer.encode(text)
    for stop in (["at seven"], ["seven,", "park"], ["t s"], ["eight."], ["nowhere"]):
        final, _ = stop_cut(text, stop)
        deltas = _feed_one_by_one(tokenizer, token_ids, stop, final)
        assert "".join(deltas) == final
    # A held-back candidate that turns out not to be a stop string is shown after all.
    detokenizer = IncrementalDetokenizer(tokenizer, ["at noon"])
    shown = "".join(detokenizer.add([t]) for t in token_ids)
    assert shown == text


def test_stop_cut_takes_the_earliest_stop():
    assert stop_cut("abc def ghi", ["ghi", "def"]) == ("abc ", True)
    assert stop_cut("abc", ["x"]) == ("abc", False)


def _salted(**kwargs) -> SamplingParams:
    return SamplingParams(cache_salt=uuid.uuid4().hex, temperature=0.0, **kwargs)


def test_generate_stream_is_incremental_and_adds_up_to_generate(tiny_engine):
    prompt = [{"role": "user", "content": "Where do you go first this morning? 朝ごはん"}]
    expected = tiny_engine.generate(prompt, _salted(max_tokens=40, ignore_eos=True))[0]
    deltas = []
    running_at_first_delta = None
    for delta in tiny_engine.generate_stream(prompt, _salted(max_tokens=40, ignore_eos=True)):
        if running_at_first_delta is None:
            running_at_first_delta = tiny_engine.stats().num_running
        deltas.append(delta)
    # The first text came while the request was still decoding, and many more followed.
    assert running_at_first_delta == 1
    assert deltas[0].output is None and len(deltas) >= 5
    assert all(d.output is None for d in deltas[:-1])
    output = deltas[-1].output
    assert output is not None and output.token_ids == expected.token_ids
    assert "".join(d.text for d in deltas) == output.text == expected.text
    assert sum(len(d.token_ids) for d in deltas[:-1]) <= len(output.token_ids)


def test_generate_stream_with_a_stop_string_matches_generate(tiny_engine):
    prompt = "Tell me about the shrine on the hill."
    full = tiny_engine.generate(prompt, _salted(max_tokens=30, ignore_eos=True))[0]
    stop = full.text[len(full.text) // 2 :][:4]
    params = _salted(max_tokens=30, ignore_eos=True, stop=[stop])
    expected = tiny_engine.generate(prompt, params)[0]
    deltas = list(tiny_engine.generate_stream(prompt, params))
    streamed = "".join(d.text for d in deltas)
    assert streamed == expected.text == deltas[-1].output.text
    assert deltas[-1].output.finish_reason == "stop" and stop not in streamed


def test_generate_stream_bad_input_is_a_value_error(tiny_engine):
    with pytest.raises(ValueError, match="prompt is empty"):
        next(tiny_engine.generate_stream([], SamplingParams()))


def test_jump_forward_tokens_are_streamed_too(tiny_engine):
    schema = {
        "type": "object",
        "properties": {"action": {"enum": ["go", "stay"]}, "reason": {"type": "string"}},
        "required": ["action", "reason"],
        "additionalProperties": False,
    }
    prompt = [{"role": "user", "content": "Where do you go?"}]
    params = _salted(max_tokens=30, json_schema=schema)
    deltas = list(tiny_engine.generate_stream(prompt, params))
    output = deltas[-1].output
    assert output.metrics.num_forced_tokens > 0
    assert "".join(d.text for d in deltas) == output.text
    assert output.text.startswith('{"action":"')
