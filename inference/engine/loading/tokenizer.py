"""The engine's tokenizer: byte-level BPE or Gemma's SentencePiece-style BPE (built in
tokenizer_spm), and the chat template, from GGUF metadata.

A GGUF file carries no tokenizer.json, only llama.cpp's `tokenizer.*` keys (vocabulary, merges,
token types, special ids, chat template). We rebuild the same pipeline the model was trained with
on the `tokenizers` library, and render the chat template with a sandboxed jinja2 environment set
up the way transformers sets it up, so prompts and ids match what a transformers user would get.
"""

from __future__ import annotations

import json
import logging
import operator
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from inference.engine.loading.tokenizer_spm import (
    DEFAULT_CACHE_DIR,
    build_spm_backend,
    respelled_vocab,
)

logger = logging.getLogger(__name__)

SUPPORTED_MODELS = ("gpt2", "llama")  # byte-level BPE; SentencePiece (Gemma only)
CHAT_ROLES = ("system", "user", "assistant")

# llama.cpp's token types (gguf.TokenType): CONTROL tokens are specials such as <|im_end|>.
_TOKEN_TYPE_CONTROL = 3

# Tokens that close a turn in the chat templates we know; the model emits them to stop, even
# where the GGUF's eos_token_id names another token.
_END_OF_TURN_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>")


def _byte_level_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    # GPT-2's split regex, then every byte spelled as one printable character.
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _smollm_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    # SmolLM's own tokenizer.json: every digit is its own piece (llama.cpp's "smollm" pre-type
    # splits on \p{N} first for the same reason), then GPT-2's byte-level split.
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), _byte_level_pre_tokenizer()]
    )


# tokenizer.ggml.pre → how text is cut into pieces before BPE merges them.
_PRE_TOKENIZERS = {
    "gpt2": _byte_level_pre_tokenizer,
    "smollm": _smollm_pre_tokenizer,
}


class Tokenizer:
    """Text ↔ token ids for one model, plus its chat template."""

    def __init__(
        self,
        *,
        backend: tokenizers.Tokenizer,
        vocab: list[str],
        bos_token_id: int | None,
        eos_token_id: int,
        add_bos_token: bool,
        add_eos_token: bool,
        chat_template: str | None,
        vocab_type: str = "byte_level",
    ) -> None:
        self._backend = backend
        self.vocab = vocab
        self.vocab_size = len(vocab)
        self.vocab_type = vocab_type  # how xgrammar reads the vocabulary's spellings
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self._add_bos_token = add_bos_token and bos_token_id is not None
        self._add_eos_token = add_eos_token
        self.chat_template_source = chat_template
        self._chat_template = _compile_chat_template(chat_template) if chat_template else None
        self.stop_token_ids = frozenset(
            {eos_token_id, *_end_of_turn_token_ids(chat_template or "", backend)}
        )

    @classmethod
    def from_gguf_metadata(
        cls, metadata: dict[str, Any], cache_dir: Path | None = DEFAULT_CACHE_DIR
    ) -> Tokenizer:
        """`cache_dir` keeps built SentencePiece tokenizers (None: build every time)."""
        model = metadata.get("tokenizer.ggml.model")
        if model not in SUPPORTED_MODELS:
            raise ValueError(
                f"unsupported tokenizer.ggml.model {model!r}: this engine builds only "
                f"{list(SUPPORTED_MODELS)} tokenizers"
            )
        if model == "llama":
            _required(metadata, "tokenizer.ggml.tokens")
            return cls(
                backend=build_spm_backend(metadata, cache_dir),
                vocab=respelled_vocab(metadata["tokenizer.ggml.tokens"]),
                vocab_type="byte_fallback",
                **_special_ids(metadata, len(metadata["tokenizer.ggml.tokens"])),
            )
        vocab = list(_required(metadata, "tokenizer.ggml.tokens"))
        merges = _required(metadata, "tokenizer.ggml.merges")
        token_types = metadata.get("tokenizer.ggml.token_type") or []
        if token_types and len(token_types) != len(vocab):
            raise ValueError(
                f"tokenizer.ggml.token_type has {len(token_types)} entries but "
                f"tokenizer.ggml.tokens has {len(vocab)}; the GGUF file is inconsistent"
            )
        backend = _build_bpe_backend(
            vocab=vocab,
            merges=merges,
            pre_tokenizer=_pre_tokenizer_for(metadata.get("tokenizer.ggml.pre")),
            special_tokens=[
                vocab[index]
                for index, token_type in enumerate(token_types)
                if token_type == _TOKEN_TYPE_CONTROL
            ],
        )
        return cls(backend=backend, vocab=vocab, **_special_ids(metadata, len(vocab)))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written in it (`<|im_start|>`) stay single ids.

        `add_special_tokens` adds the BOS/EOS the GGUF asks for (tokenizer.ggml.add_*_token).
        """
        if not isinstance(text, str):
            raise ValueError(f"encode() takes a str, got {type(text).__name__}")
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens:
            if self._add_bos_token:
                ids = [self.bos_token_id, *ids]
            if self._add_eos_token:
                ids = [*ids, self.eos_token_id]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        try:
            # operator.index also takes numpy/torch integer scalars, which samplers hand back.
            ids = [operator.index(i) for i in ids]
        except TypeError as error:
            raise ValueError(f"decode() takes a list of int token ids: {error}") from error
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(
                f"decode() got ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}"
            )
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text for `messages`, rendered by the model's own chat template."""
        if self._chat_template is None:
            raise ValueError(
                "this model's GGUF has no tokenizer.chat_template and no turn tokens we know: "
                "send the prompt as plain text or token ids, not chat messages"
            )
        return self._chat_template.render(
            messages=_validated_messages(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self._token_text(self.bos_token_id),
            eos_token=self._token_text(self.eos_token_id),
        )

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True
    ) -> list[int]:
        # The template writes every special token itself, so none are added on top.
        return self.encode(self.render_chat(messages, add_generation_prompt))

    def _token_text(self, token_id: int | None) -> str:
        return "" if token_id is None else self.vocab[token_id]


def _build_bpe_backend(
    *,
    vocab: list[str],
    merges: list[str],
    pre_tokenizer: pre_tokenizers.PreTokenizer,
    special_tokens: list[str],
) -> tokenizers.Tokenizer:
    token_to_id = {token: index for index, token in enumerate(vocab)}
    if len(token_to_id) != len(vocab):
        raise ValueError("tokenizer.ggml.tokens repeats a token; the GGUF file is inconsistent")
    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep or not left or not right:
            raise ValueError(f"tokenizer.ggml.merges entry {merge!r} is not two tokens 'a b'")
        pairs.append((left, right))
    backend = tokenizers.Tokenizer(models.BPE(vocab=token_to_id, merges=pairs, fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizer
    backend.decoder = decoders.ByteLevel()
    # Already in the vocabulary, so their ids do not move; this only stops BPE from cutting them.
    backend.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in special_tokens]
    )
    return backend


def _pre_tokenizer_for(name: str | None) -> pre_tokenizers.PreTokenizer:
    if name is None:
        logger.warning("GGUF has no tokenizer.ggml.pre; splitting text the GPT-2 way")
        name = "gpt2"
    factory = _PRE_TOKENIZERS.get(name)
    if factory is None:
        raise ValueError(
            f"unsupported tokenizer.ggml.pre {name!r}: known pre-tokenizers are "
            f"{sorted(_PRE_TOKENIZERS)}; add its split rules to "
            "inference/engine/loading/tokenizer.py"
        )
    return factory()


def _end_of_turn_token_ids(chat_template: str, backend: tokenizers.Tokenizer) -> list[int]:
    found = []
    for token in _END_OF_TURN_TOKENS:
        token_id = backend.token_to_id(token)
        if token in chat_template and token_id is not None:
            found.append(token_id)
    return found


def _special_ids(metadata: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    return dict(
        bos_token_id=_token_id(metadata, "tokenizer.ggml.bos_token_id", vocab_size),
        eos_token_id=_token_id(metadata, "tokenizer.ggml.eos_token_id", vocab_size, required=True),
        add_bos_token=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        add_eos_token=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        chat_template=metadata.get("tokenizer.chat_template") or _turn_format_for(metadata),
    )


# Gemma's turn format, each message one turn (a system message is a user turn, as Gemma has no
# system role), so that rendering a prefix of the messages gives a prefix of the tokens: what
# prefix caching needs. Used only when a GGUF with Gemma's turn tokens has no template of its
# own (gemma3-270m is a base model).
GEMMA_TURN_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else 'user' }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def _turn_format_for(metadata: dict[str, Any]) -> str | None:
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    if "<start_of_turn>" in tokens and "<end_of_turn>" in tokens:
        logger.info("the GGUF has no chat template; chat messages use Gemma's turn format")
        return GEMMA_TURN_TEMPLATE
    return None


def _required(metadata: dict[str, Any], key: str) -> Any:
    value = metadata.get(key)
    if not value:
        raise ValueError(f"GGUF metadata lacks {key}; it cannot be tokenized without it")
    return value


def _token_id(
    metadata: dict[str, Any], key: str, vocab_size: int, *, required: bool = False
) -> int | None:
    value = metadata.get(key)
    if value is None:
        if required:
            raise ValueError(f"GGUF metadata lacks {key}")
        return None
    if not isinstance(value, int) or not 0 <= value < vocab_size:
        raise ValueError(f"GGUF metadata {key}={value!r} is not a token id below {vocab_size}")
    return value


def _validated_messages(messages: Any) -> list[dict[str, str]]:
    """Role and content of each message; other keys (e.g. "cache") are the caller's and dropped."""
    if not isinstance(messages, list):
        raise ValueError(
            'messages must be a list of dicts like [{"role": "user", "content": "..."}], '
            f"got {type(messages).__name__}"
        )
    if not messages:
        raise ValueError("messages is empty: a chat needs at least one message")
    validated = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{index}] must be a dict, got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            raise ValueError(f"messages[{index}]['role'] must be one of {CHAT_ROLES}, got {role!r}")
        if not isinstance(content, str):
            raise ValueError(
                f"messages[{index}]['content'] must be a str, got {type(content).__name__}"
            )
        validated.append({"role": role, "content": content})
    return validated


def _raise_exception(message: str) -> None:
    # Templates call this to reject a conversation (e.g. roles out of order): the caller's input.
    raise ValueError(f"the chat template rejected the messages: {message}")


def _tojson(value: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # jinja2's own tojson escapes HTML characters, which a prompt must not contain.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _compile_chat_template(source: str) -> jinja2.Template:
    # Chat templates are untrusted code from the model file, hence the sandbox; trim_blocks and
    # lstrip_blocks are what transformers renders with, and templates are written for it.
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    try:
        return environment.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"tokenizer.chat_template is not valid jinja2: {error}") from error
