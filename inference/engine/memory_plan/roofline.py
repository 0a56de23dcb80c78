"""The decode roofline of a DeepSeek-V4 model: the bytes one decode step reads per rank at n
sequences in flight, and the tokens/s that memory bandwidth allows, from the memory plan's
per-tensor bytes (weights.tensor_bytes) and the model's config alone.

A decode step reads, on each rank:
- every weight it holds once (attention, the shared expert's slice, routers, norms, mHC, the
  output head's vocabulary slice); V4's attention is replicated, so every rank reads all of it;
- of the routed experts it holds, those the step's tokens pick: with k of E experts picked per
  token, an expert is untouched by n tokens with probability (1 - k/E)^n, so a rank holding m
  experts of a layer reads m (1 - (1 - k/E)^n) of them (the choices taken as independent);
- of the lookup tables (embedding, hash routing) only the tokens' rows;
- not the MTP layer (a plain decode step has no draft);
- each sequence's attention state at its context (attention is replicated: every rank reads
  every sequence's): the window's K=V, CSA's indexer keys and its top-k entries, HCA's
  entries, and (amortized) one token's compressor inputs a layer.
Compute, communication and kernel efficiency are left out: the roofline is the bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.engine.memory_plan.model_spec import ModelSpec
from inference.engine.memory_plan.weights import Sharding, meta_model, tensor_bytes
from inference.engine.models.deepseek_v4.config import CSA, HCA

_LOOKUP_TABLES = ("model.embed_tokens.weight", ".mlp.gate.tid2eid")


@dataclass(frozen=True, slots=True)
class StepRead:
    """What one decode step at `num_in_flight` reads on its busiest rank, by part (bytes)."""

    num_in_flight: int
    dense: int  # weights read once a step, whatever n
    routed_experts: float  # the expected distinct experts' bytes
    distinct_experts_per_layer: float  # expected, over all ranks
    state: int  # the sequences' attention state
    total_all_ranks: float  # what every rank reads together

    @property
    def total(self) -> float:
        return self.dense + self.routed_experts + self.state

    def step_s(self, bandwidth_bytes_per_s: float) -> float:
        return self.total / bandwidth_bytes_per_s


def expected_distinct_experts(num_experts: int, top_k: int, num_tokens: int) -> float:
    """Distinct experts of a layer that num_tokens tokens pick, k each of E: E (1 - (1-k/E)^n)."""
    return num_experts * (1 - (1 - top_k / num_experts) ** num_tokens)


def decode_reads(
    spec: ModelSpec,
    sharding_world: int,
    in_flight: list[int],
    context_tokens: int,
    dtype: torch.dtype = torch.bfloat16,
) -> list[StepRead]:
    """A StepRead per entry of `in_flight`, for `spec` split over `sharding_world` ranks (expert
    parallel), each sequence at `context_tokens` of context."""
    if spec.arch != "deepseek_v4":
        raise ValueError(
            f"the roofline is DeepSeek-V4's (routed experts, compressed state); "
            f"{spec.name} is {spec.arch}"
        )
    if not in_flight or min(in_flight) < 1:
        raise ValueError(f"sequences in flight must be >= 1, got {in_flight}")
    if context_tokens < 1:
        raise ValueError(f"context tokens must be >= 1, got {context_tokens}")
    config = spec.config
    model = meta_model(spec)
    ranks = [
        list(
            tensor_bytes(
                spec, model, dtype, Sharding(sharding_world, sharding_world > 1, r), "fp32"
            )
        )
        for r in range(sharding_world)
    ]
    state = state_read_bytes(config, context_tokens, dtype.itemsize)
    reads = []
    for n in in_flight:
        touched = 1 - (1 - config.num_experts_per_tok / config.num_experts) ** n
        per_rank = [_rank_read(rows, n, touched) for rows in ranks]
        dense, experts = max(per_rank, key=sum)
        reads.append(
            StepRead(
                num_in_flight=n,
                dense=dense,
                routed_experts=experts,
                distinct_experts_per_layer=config.num_experts * touched,
                state=n * state,
                total_all_ranks=sum(map(sum, per_rank)) + sharding_world * n * state,
            )
        )
    return reads


def _rank_read(rows, num_tokens: int, touched: float) -> tuple[int, float]:
    """(dense bytes, expected routed-expert bytes) one rank reads in a step of num_tokens."""
    experts = sum(size for name, kind, size, _ in rows if kind == "experts" and _in_step(name))
    return dense_read_bytes(rows, num_tokens), experts * touched


def dense_read_bytes(rows, num_tokens: int) -> int:
    """Of tensor_bytes' `rows`, what a decode step of num_tokens reads whichever experts it
    routes to: every tensor but the routed experts and the MTP layer, of the lookup tables only
    the tokens' rows."""
    dense = 0
    for name, kind, size, tensor in rows:
        if kind == "experts" or not _in_step(name):
            continue
        if name.endswith(_LOOKUP_TABLES):
            dense += size * min(num_tokens, tensor.shape[0]) // tensor.shape[0]
        else:
            dense += size
    return dense


def _in_step(name: str) -> bool:
    return not name.startswith("mtp.")  # a plain decode step has no draft


def state_read_bytes(config, context_tokens: int, itemsize: int) -> int:
    """Attention state one sequence's decode step reads at `context_tokens` (all layers)."""
    kinds = config.attention_kinds
    num_csa, num_hca = kinds.count(CSA), kinds.count(HCA)
    hd, ihd = config.head_dim, config.index_head_dim
    window = min(context_tokens, config.sliding_window) * config.num_layers * hd
    csa_entries = context_tokens // config.csa_rate
    csa = num_csa * (csa_entries * ihd + min(config.index_topk, csa_entries) * hd)
    hca = num_hca * (context_tokens // config.hca_rate) * hd
    compressor = num_csa * config.projection_width(CSA) + num_hca * config.projection_width(HCA)
    return (window + csa + hca + compressor) * itemsize
