"""Block hashes: each full block's key chains its parent's hash, its tokens and extra keys."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, NewType

import numpy as np

if TYPE_CHECKING:
    from inference.engine.request import Request

BlockHash = NewType("BlockHash", bytes)
REPLAY_MARK = b"\x1freplay"


def hash_block_tokens(
    parent: BlockHash | None, token_ids: list[int] | tuple[int, ...], extra: bytes
) -> BlockHash:
    """sha256(parent ‖ extra ‖ tokens). `extra` carries the model fingerprint and cache salt."""
    digest = hashlib.sha256()
    digest.update(parent or b"\0" * 32)
    digest.update(extra)
    digest.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return BlockHash(digest.digest())


def extra_keys(model_fingerprint: str, cache_salt: str | None) -> bytes:
    """Requests with different salts (tenants) or models can never share a block."""
    salt = cache_salt or ""
    return f"{model_fingerprint}\x1f{salt}".encode()


def root_hash(extra: bytes) -> BlockHash:
    """The parent key of a request's first block in the children index: one per model and salt,
    so first blocks of other tenants are never compared with this request's tokens."""
    return hash_block_tokens(None, (), extra)


def hash_request_blocks(
    token_ids: list[int],
    block_size: int,
    extra: bytes,
    known: list[BlockHash],
) -> list[BlockHash]:
    """Extend `known` (hashes of the first blocks) to cover every full block of token_ids."""
    hashes = list(known)
    parent = hashes[-1] if hashes else None
    for start in range(len(hashes) * block_size, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size], extra)
        hashes.append(parent)
    return hashes


class BlockHasher:
    """A request's chain hashes and children-index keys for one model, shared by every KV
    cache group (all groups key a block the same way)."""

    def __init__(self, block_size: int, model_fingerprint: str) -> None:
        self.block_size = block_size
        self.model_fingerprint = model_fingerprint

    def extra(self, request: Request) -> bytes:
        return extra_keys(self.model_fingerprint, request.sampling_params.cache_salt)

    def chain_extra(self, request: Request) -> bytes:
        """The extra keys of the request's blocks not hashed yet: a bounded replay's blocks
        (approximate state) carry a mark, so no exact request ever matches them."""
        extra = self.extra(request)
        return extra + REPLAY_MARK if request.replay_start is not None else extra

    def update(self, request: Request) -> None:
        """Hash the request's full blocks not hashed yet."""
        request.block_hashes = hash_request_blocks(
            request.all_token_ids, self.block_size, self.chain_extra(request), request.block_hashes
        )

    def parent_hash(self, request: Request, index: int) -> BlockHash:
        """Block `index`'s key in the children index: the chain hash before it, or the root of
        the request's model and salt for the first block."""
        return request.block_hashes[index - 1] if index else root_hash(self.extra(request))
