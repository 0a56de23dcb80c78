"""Decode steps replayed from CUDA graphs.

A decode step of a small model is dozens of kernel launches whose CPU cost exceeds their GPU
time; a CUDA graph replays them all with one launch. Graphs are captured once, for batch sizes
1, 2, 4, ... 64 (up to max_num_seqs); a step of n decoding sequences replays the smallest graph
of at least n, its extra rows padded: slot -1 (the KV store skips it) and length 0 (attention
writes zeros). The graphs read static input buffers, filled before each replay, and their
decode attention grid is sized for `max_len` tokens so that any length up to it replays.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from inference.engine.attention.attention_backend import ScheduledSpan
from inference.engine.kernels.metadata import DecodeBatch, KernelAttentionMetadata, KernelMetadata

logger = logging.getLogger(__name__)

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """The captured sizes: every one up to the first that holds max_num_seqs (64 at most)."""
    if max_num_seqs >= BATCH_SIZES[-1]:
        return list(BATCH_SIZES)
    return [s for s in BATCH_SIZES if s < max_num_seqs] + [
        next(s for s in BATCH_SIZES if s >= max_num_seqs)
    ]


class DecodeGraphs:
    """Static inputs for padded decode steps, and the graphs that replay those steps.

    `prepare` + `forward` run one padded step eagerly from the static inputs (what a graph
    records; testable on CPU under the interpreter); `capture` records the graphs (CUDA only)
    and `run` fills the inputs and replays."""

    def __init__(
        self, block_size: int, max_len: int, max_num_seqs: int, device: torch.device
    ) -> None:
        self.sizes = graph_batch_sizes(max_num_seqs)
        self.block_size = block_size
        self.max_len = max_len
        self.max_blocks = -(-max_len // block_size)
        self.num_replays = 0
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(n, self.max_blocks, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.rows = torch.arange(n, dtype=torch.int32, device=device)
        self.logits_indices = torch.arange(n, dtype=torch.long, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}

    def forward(self, model: nn.Module, kv_caches, size: int) -> torch.Tensor:
        """One decode step of `size` rows from the static inputs: (size, vocab) logits."""
        decode = DecodeBatch(
            self.rows[:size], self.block_tables[:size], self.seq_lens[:size],
            max_seq_len=self.max_blocks * self.block_size,
        )  # fmt: skip
        meta = KernelAttentionMetadata(
            self.slot_mapping[:size], KernelMetadata(self.block_size, decode, None)
        )
        return model(
            self.input_ids[:size], self.positions[:size], kv_caches, meta,
            self.logits_indices[:size],
        )  # fmt: skip

    @torch.inference_mode()
    def capture(self, model: nn.Module, kv_caches) -> None:
        device = self.input_ids.device
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        torch.cuda.set_device(device)  # the capture stream and triton launch on the current one
        # The inputs are all padding until the first `prepare` (slot -1, length 0): warming up
        # and capturing leave the cache untouched.
        pool = None
        for size in reversed(self.sizes):  # largest first: the smaller ones reuse its memory
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm up: compiles the kernels outside the capture
                self.forward(model, kv_caches, size)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[size] = self.forward(model, kv_caches, size)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info("captured decode CUDA graphs for batch sizes %s", self.sizes)

    def can_run(self, spans: list[ScheduledSpan], num_sampled: int) -> bool:
        """A pure decode step that fits a captured size, every sequence sampled."""
        return (
            bool(self.graphs)
            and 0 < len(spans) <= self.sizes[-1]
            and num_sampled == len(spans)
            and all(
                s.query_len == 1 and s.num_computed < self.max_len
                and len(s.block_ids) <= self.max_blocks
                for s in spans
            )
        )  # fmt: skip

    def prepare(
        self,
        input_ids: list[int],
        positions: list[int],
        slot_mapping: list[int],
        spans: list[ScheduledSpan],
    ) -> int:
        """Fill the static inputs for these decoding sequences, padding up to the smallest
        captured size (slot -1, length 0); returns that size."""
        n = len(spans)
        size = next(s for s in self.sizes if s >= max(n, 1))
        pad = size - n
        tables = torch.zeros(n, self.max_blocks, dtype=torch.int32)
        for row, span in enumerate(spans):
            tables[row, : len(span.block_ids)] = torch.tensor(span.block_ids, dtype=torch.int32)
        host = torch.tensor(
            [input_ids + [0] * pad, positions + [0] * pad, slot_mapping + [-1] * pad,
             [s.num_computed + 1 for s in spans] + [0] * pad],
            dtype=torch.long,
        )  # fmt: skip
        self.input_ids[:size].copy_(host[0])
        self.positions[:size].copy_(host[1])
        self.slot_mapping[:size].copy_(host[2])
        self.seq_lens[:size].copy_(host[3])
        self.block_tables[:n].copy_(tables)
        return size

    def run(
        self,
        input_ids: list[int],
        positions: list[int],
        slot_mapping: list[int],
        spans: list[ScheduledSpan],
    ) -> torch.Tensor:
        """Fill the static inputs, replay the graph of that size: (n, vocab) logits."""
        size = self.prepare(input_ids, positions, slot_mapping, spans)
        self.graphs[size].replay()
        self.num_replays += 1
        return self.logits[size][: len(spans)]
