"""The layers of a sharded model: each holds its rank's slice of a full layer's weight.

- ColumnParallelLinear: some output rows (attention heads, MLP columns); no communication, its
  output stays split (the next layer reads only its own slice).
- RowParallelLinear: the matching input columns; each rank's product is a partial sum of the
  full one, summed over the ranks (all-reduce). Megatron's pairing: column then row, one
  all-reduce per block (attention, MLP).
- VocabParallelEmbedding: a range of the vocabulary's rows; a token outside the range reads
  zeros, and the all-reduce adds the one rank's row that holds it.
- VocabParallelLMHead: the same rows as a head; each rank's logits for its range are gathered on
  rank 0, which samples (rank 0 returns the full (N, vocab) logits, the others (N, 0)).

The slices are contiguous ranges (`balanced_range`), as even as the sizes allow: uneven sizes
are fine (SmolLM2-135M has 9 heads and 3 KV heads: 2 ranks take 2 and 1 KV heads).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.distributed.communicator import Communicator


def balanced_range(total: int, rank: int, world_size: int) -> range:
    """Rank's contiguous share of `total` items; shares differ by at most one, larger first."""
    base, extra = divmod(total, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


def _rows(weight: torch.Tensor, ranges: list[range]) -> torch.Tensor:
    return torch.cat([weight[r.start : r.stop] for r in ranges]).clone()


class ColumnParallelLinear(nn.Module):
    """The output rows `ranges` of a bias-free linear layer (concatenated in that order)."""

    def __init__(self, linear: nn.Linear, ranges: list[range]) -> None:
        super().__init__()
        if linear.bias is not None:
            raise ValueError("parallel linear layers with a bias are not supported yet")
        self.weight = nn.Parameter(_rows(linear.weight.data, ranges), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    """The input columns `columns` of a bias-free linear layer; the ranks' outputs summed."""

    def __init__(self, linear: nn.Linear, columns: range, comm: Communicator) -> None:
        super().__init__()
        if linear.bias is not None:
            raise ValueError("parallel linear layers with a bias are not supported yet")
        weight = linear.weight.data[:, columns.start : columns.stop].clone()
        self.weight = nn.Parameter(weight, requires_grad=False)  # (out, columns)
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(F.linear(x, self.weight))


class VocabParallelEmbedding(nn.Module):
    def __init__(self, embedding: nn.Embedding, comm: Communicator) -> None:
        super().__init__()
        vocab = embedding.weight.shape[0]
        self.vocab = balanced_range(vocab, comm.rank, comm.world_size)
        self.weight = nn.Parameter(_rows(embedding.weight.data, [self.vocab]), requires_grad=False)
        self.comm = comm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        mine = (input_ids >= self.vocab.start) & (input_ids < self.vocab.stop)  # (T,)
        local = torch.where(mine, input_ids - self.vocab.start, 0)
        x = F.embedding(local, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return self.comm.all_reduce(x)  # (T, hidden)


class VocabParallelLMHead(nn.Module):
    """`weight`: this rank's vocabulary rows (a Parameter of its own, or the embedding's shard
    when the head is tied to it); `vocab_size`: the full vocabulary."""

    def __init__(self, weight: nn.Parameter, vocab_size: int, comm: Communicator) -> None:
        super().__init__()
        self.weight = weight
        self.vocab_size = vocab_size
        self.comm = comm
        self.max_rows = -(-vocab_size // comm.world_size)  # the largest share: gather pads to it
        expected = len(balanced_range(vocab_size, comm.rank, comm.world_size))
        if weight.shape[0] != expected:
            raise ValueError(f"lm head shard has {weight.shape[0]} rows, expected {expected}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.linear(x, self.weight)  # (N, rows of this rank)
        padded = F.pad(local, (0, self.max_rows - local.shape[-1]))  # (N, max_rows)
        parts = self.comm.gather_to_first(padded)
        if parts is None:
            return local[:, :0]
        sizes = [
            len(balanced_range(self.vocab_size, r, self.comm.world_size))
            for r in range(self.comm.world_size)
        ]
        return torch.cat([p[:, :n] for p, n in zip(parts, sizes, strict=True)], dim=-1)


def shard_embedding_and_head(model: nn.Module, embed_owner: nn.Module, comm: Communicator) -> None:
    """Replace `embed_owner.embed_tokens` and `model.lm_head` by their vocabulary-parallel
    shards; a head tied to the embedding (`lm_head.tied`) shares the embedding's shard."""
    embedding = VocabParallelEmbedding(embed_owner.embed_tokens, comm)
    head = model.lm_head
    vocab_size = embed_owner.embed_tokens.weight.shape[0]
    if getattr(head, "tied", False):
        weight = embedding.weight
    else:
        rows = balanced_range(head.weight.shape[0], comm.rank, comm.world_size)
        weight = nn.Parameter(_rows(head.weight.data, [rows]), requires_grad=False)
    embed_owner.embed_tokens = embedding
    model.lm_head = VocabParallelLMHead(weight, vocab_size, comm)
