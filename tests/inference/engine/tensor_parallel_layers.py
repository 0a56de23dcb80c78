"""What each rank of test_tensor_parallel's layer test runs (a module of its own: spawned
processes import it by name). Sizes are odd on purpose, so the shares are uneven."""

from __future__ import annotations

import torch
from torch import nn

from inference.engine.distributed.communicator import close_distributed, init_distributed
from inference.engine.distributed.parallel_layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    VocabParallelLMHead,
    balanced_range,
)

HIDDEN, INNER, VOCAB = 6, 7, 11


def full_layers() -> tuple[nn.Linear, nn.Linear, nn.Embedding, nn.Linear]:
    """The same random layers in every process."""
    torch.manual_seed(0)
    up, down = nn.Linear(HIDDEN, INNER, bias=False), nn.Linear(INNER, HIDDEN, bias=False)
    return up, down, nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False)


def reference(input_ids: torch.Tensor) -> torch.Tensor:
    up, down, embed, head = full_layers()
    with torch.no_grad():
        return head(down(torch.relu(up(embed(input_ids)))))


def run_rank(rank: int, port: int, input_ids: torch.Tensor, results) -> None:
    comm = init_distributed(rank, 2, "127.0.0.1", port, torch.device("cpu"), 60.0)
    try:
        up, down, embed, head = full_layers()
        inner = balanced_range(INNER, rank, 2)
        vocab = balanced_range(VOCAB, rank, 2)
        parallel_up = ColumnParallelLinear(up, [inner])
        parallel_down = RowParallelLinear(down, inner, comm)
        parallel_embed = VocabParallelEmbedding(embed, comm)
        head_rows = nn.Parameter(head.weight.data[vocab.start : vocab.stop].clone())
        parallel_head = VocabParallelLMHead(head_rows, VOCAB, comm)
        with torch.no_grad():
            hidden = parallel_down(torch.relu(parallel_up(parallel_embed(input_ids))))
            logits = parallel_head(hidden)
        # A numpy copy travels by value: a tensor would travel as a file descriptor of shared
        # memory, which the reader cannot take once this rank has exited.
        results.put((rank, logits.numpy().copy()))
    finally:
        close_distributed()
