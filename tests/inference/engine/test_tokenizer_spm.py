"""Gemma's SentencePiece-style tokenizer built from the GGUF: id for id against transformers'
own GGUF tokenizer, and the disk cache that makes a second load fast."""

from __future__ import annotations

import pytest

from inference.engine.loading import tokenizer_spm
from inference.engine.loading.gguf_file import open_gguf, read_metadata
from inference.engine.loading.model_files import gguf_path_for
from inference.engine.loading.tokenizer import Tokenizer

pytestmark = pytest.mark.real_model

TEXTS = [
    "Hello world, こんにちは 世界!",
    "町の住民は朝8時にパン屋へ行きます。神社は六時に閉まります。",
    "ぽこまちの広場で、ゆいさんは「おはよう！」と言った。",
    "<start_of_turn>user\nWhere do you go?<end_of_turn>\n<start_of_turn>model\n",
    "   three leading spaces, two  inside, trailing   ",
    "\t\t\ttabs\n\n\nnewlines\r\nCRLF",
    "emoji 🎉🍞🏯 and rare ĉaractères, 𠮷野家, ℃, Ω",
    '{"action": "go_to", "target": "bakery", "reason": "朝ごはん"}',
    "1234567890 3.14159 1e-5 0x1F",
    "def f(x):\n    return x ** 2  # square\n",
    "<bos>not at the start <eos> <pad> <unk>",
    "",
]


@pytest.fixture(scope="module")
def metadata():
    return read_metadata(open_gguf(gguf_path_for("gemma3-270m")))


@pytest.fixture(scope="module")
def hf_tokenizer():
    transformers = pytest.importorskip("transformers")
    path = gguf_path_for("gemma3-270m")
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def built(metadata, tmp_path_factory):
    cache_dir = tmp_path_factory.mktemp("tokenizers")
    return Tokenizer.from_gguf_metadata(metadata, cache_dir=cache_dir), cache_dir


@pytest.mark.parametrize("text", TEXTS)
def test_ids_and_text_match_transformers(built, hf_tokenizer, text):
    ours, _ = built
    expected = hf_tokenizer(text)["input_ids"]  # with the <bos> the GGUF asks for
    assert ours.encode(text, add_special_tokens=True) == expected
    assert ours.encode(text) == expected[1:]
    assert ours.decode(expected) == hf_tokenizer.decode(expected, skip_special_tokens=True)
    assert ours.decode(expected, skip_special_tokens=False) == hf_tokenizer.decode(expected)


def test_a_second_load_reads_the_cache_and_gives_the_same_ids(built, metadata, monkeypatch):
    first, cache_dir = built
    assert len(list(cache_dir.glob("*.json"))) == 1

    def no_rebuild(*args):
        raise AssertionError("the tokenizer was rebuilt instead of read from the cache")

    monkeypatch.setattr(tokenizer_spm, "_build", no_rebuild)
    second = Tokenizer.from_gguf_metadata(metadata, cache_dir=cache_dir)
    for text in TEXTS:
        assert second.encode(text, add_special_tokens=True) == first.encode(
            text, add_special_tokens=True
        )


def test_a_torn_cache_file_is_rebuilt(built, metadata):
    _, cache_dir = built
    (path,) = cache_dir.glob("*.json")
    good = path.read_text()
    path.write_text(good[: len(good) // 2])
    again = Tokenizer.from_gguf_metadata(metadata, cache_dir=cache_dir)
    assert again.encode("こんにちは") == built[0].encode("こんにちは")
    assert path.read_text() == good


def test_specials_and_vocabulary(built):
    ours, _ = built
    assert ours.vocab_size == 262144
    assert (ours.bos_token_id, ours.eos_token_id) == (2, 1)
    assert ours.encode("<start_of_turn><end_of_turn>") == [105, 106]
    assert ours.vocab_type == "byte_fallback"
    # No chat template in the GGUF: chat messages use Gemma's turn format, whose turns end
    # with <end_of_turn> (transformers' generation config for Gemma 3 stops on both too).
    assert ours.stop_token_ids == {1, 106}
