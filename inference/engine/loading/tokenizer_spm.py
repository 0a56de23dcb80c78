"""SentencePiece-style BPE (Gemma) rebuilt from GGUF metadata, cached on disk once built.

A Gemma GGUF stores `tokenizer.ggml.model = "llama"`: the vocabulary with scores and token
types but no merges. We build the pipeline transformers builds for the same file (its GGUF
Gemma converter: spaces become "▁", BPE with byte fallback, merges recovered from the
vocabulary in file order), so ids match a transformers user's exactly. Recovering ~500k merges
for a 262k vocabulary takes seconds, so the built tokenizer's JSON is kept under a cache
directory, keyed by a hash of everything it is built from; a second load reads that file.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers

logger = logging.getLogger(__name__)

# Part of the cache key: bump it when the built pipeline changes, so stale files are not used.
BUILDER_VERSION = "gemma-spm-1"
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "pokomachi" / "tokenizers"
SUPPORTED_ARCHITECTURES = ("gemma", "gemma2", "gemma3")

# llama.cpp's token types (gguf.TokenType).
_CONTROL, _USER_DEFINED = 3, 4


def respelled_vocab(tokens: list[str]) -> list[str]:
    """Gemma's whitespace-only tokens are stored with real spaces ("  "); the model looks them up
    as "▁▁" (spaces are "▁" after normalizing)."""
    return ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]


def build_spm_backend(
    metadata: dict[str, Any], cache_dir: Path | None = DEFAULT_CACHE_DIR
) -> tokenizers.Tokenizer:
    """The tokenizers pipeline for a Gemma GGUF, from the disk cache when it is there."""
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            "tokenizer.ggml.model 'llama' (SentencePiece) is supported for "
            f"{SUPPORTED_ARCHITECTURES} only, this GGUF is {arch!r}"
        )
    tokens = list(metadata["tokenizer.ggml.tokens"])
    token_types = list(metadata.get("tokenizer.ggml.token_type") or [])
    if token_types and len(token_types) != len(tokens):
        raise ValueError(
            f"tokenizer.ggml.token_type has {len(token_types)} entries but tokenizer.ggml.tokens "
            f"has {len(tokens)}; the GGUF file is inconsistent"
        )
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else "<unk>"
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"{_cache_key(tokens, token_types, unk)}.json"
        if path.is_file():
            try:
                return tokenizers.Tokenizer.from_file(str(path))
            except Exception as error:  # a torn or foreign file: rebuild it
                logger.warning("ignoring unreadable cached tokenizer %s: %s", path, error)
    backend = _build(tokens, token_types, unk)
    if path is not None:
        _write_atomically(path, backend.to_str())
    return backend


def _build(tokens: list[str], token_types: list[int], unk: str) -> tokenizers.Tokenizer:
    vocab_list = respelled_vocab(tokens)
    vocab = {token: index for index, token in enumerate(vocab_list)}
    # Merge order: Gemma's scores do not follow it, the order of tokens in the file does.
    ranks = {token: -index for index, token in enumerate(vocab_list)}
    backend = tokenizers.Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=_recover_merges(vocab, ranks),
            fuse_unk=True,
            unk_token=unk,
            dropout=None,
            byte_fallback=True,
        )
    )
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.pre_tokenizer = pre_tokenizers.Split(
        pattern=" ", behavior="merged_with_previous", invert=False
    )
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    # Control tokens (<bos>, <start_of_turn>, ...) stay whole and are skipped when decoding;
    # user-defined ones (e.g. runs of tabs) stay whole too but are text.
    typed = list(zip(tokens, token_types, strict=True))
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, kind in typed if kind == _CONTROL]
    )
    backend.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, kind in typed
            if kind == _USER_DEFINED and t in vocab
        ]
    )
    return backend


def _recover_merges(vocab: dict[str, int], ranks: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of a token into two vocabulary tokens is a merge; best-ranked result first
    (transformers' generate_merges, which the reference tokenizer is built with)."""
    merges = []
    for token, rank in ranks.items():
        local = [
            (token[:i], token[i:], rank)
            for i in range(1, len(token))
            if token[:i] in vocab and token[i:] in vocab
        ]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _cache_key(tokens: list[str], token_types: list[int], unk: str) -> str:
    digest = hashlib.sha256(BUILDER_VERSION.encode())
    digest.update(unk.encode())
    digest.update("\0".join(tokens).encode("utf-8", errors="surrogatepass"))
    digest.update(bytes(t & 0xFF for t in token_types))
    return digest.hexdigest()[:32]


def _write_atomically(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except OSError as error:  # a read-only home still gets a working (slower) tokenizer
        logger.warning("could not cache the tokenizer at %s: %s", path, error)
