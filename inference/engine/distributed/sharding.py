"""Turning a loaded model into this rank's shard, architecture by architecture (the plans).

Every rank loads the same model (same file, or the same seed for a tiny random one) and keeps
its slice; the runner then sizes its KV cache from the shard's config, so a block holds the
same positions on every rank with fewer bytes (block tables are rank 0's and the same for all).

Llama family and Gemma 3 (tensor parallel, Megatron's plan):
  embed_tokens         vocabulary-parallel (rows), all-reduce
  self_attn.qkv_proj   column-parallel by heads: a rank's query heads and the KV heads they
                       read (GQA groups kept whole; with fewer KV heads than ranks each KV
                       head is replicated on the ranks that share its query heads)
  self_attn.o_proj     row-parallel (the same heads' columns), all-reduce
  mlp.gate_up_proj     column-parallel (the same range of gate and of up rows)
  mlp.down_proj        row-parallel, all-reduce
  norms, rope          replicated
  lm_head              vocabulary-parallel, gathered on rank 0 (tied heads share the shard)

DeepSeek-V4 (expert parallel; transformers' base_model_ep_plan splits the same parts):
  embed_tokens, lm_head  vocabulary-parallel, as above
  mlp.experts          expert-parallel: rank r holds a contiguous range of the routed experts
                       and computes them for the tokens routed there
  mlp.shared_experts   intermediate split (column then row); its partial sum joins the
                       experts' in the layer's one all-reduce
  mlp.gate (router)    replicated: every rank routes every token the same way
  self_attn            replicated: one KV head shared by all query heads (MQA) cannot be
                       split, and its compressed state (compressors, indexer) with it; splitting
                       the query heads with the KV replicated is possible, not done
  hyper-connections, norms  replicated (small)
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.distributed.communicator import Communicator
from inference.engine.distributed.parallel_layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    balanced_range,
    shard_embedding_and_head,
)
from inference.engine.models import LoadedModel
from inference.engine.models.deepseek_v4 import DeepseekV4ForCausalLM
from inference.engine.models.deepseek_v4.moe import MLP, MoE
from inference.engine.models.gemma3 import Gemma3ForCausalLM
from inference.engine.models.llama import LlamaForCausalLM
from inference.engine.models.packed.linear import Fp8Linear


@dataclasses.dataclass(frozen=True, slots=True)
class HeadShard:
    q_heads: range
    kv_heads: range


def head_shard(num_heads: int, num_kv_heads: int, rank: int, world_size: int) -> HeadShard:
    """This rank's query heads and the KV heads they read (ValueError where they cannot be
    split so that every rank gets whole GQA groups or an equal part of one)."""
    if num_heads < world_size:
        raise ValueError(
            f"the model has {num_heads} attention heads; tensor_parallel_size "
            f"{world_size} would leave a rank without one: use at most {num_heads}"
        )
    group = num_heads // num_kv_heads  # query heads per KV head
    if num_kv_heads >= world_size:
        kv = balanced_range(num_kv_heads, rank, world_size)
        return HeadShard(range(kv.start * group, kv.stop * group), kv)
    if world_size % num_kv_heads or group % (world_size // num_kv_heads):
        raise ValueError(
            f"the model's {num_kv_heads} KV heads (each read by {group} query heads) cannot be "
            f"shared by {world_size} ranks: with fewer KV heads than ranks, "
            "tensor_parallel_size must be a multiple of the KV heads and divide each KV head's "
            "query heads evenly"
        )
    ranks_per_kv = world_size // num_kv_heads
    kv_head = rank // ranks_per_kv
    per_rank = group // ranks_per_kv
    start = kv_head * group + (rank % ranks_per_kv) * per_rank
    return HeadShard(range(start, start + per_rank), range(kv_head, kv_head + 1))


def shard_model(loaded: LoadedModel, comm: Communicator, *, expert_parallel: bool) -> LoadedModel:
    """This rank's shard of `loaded` (its model changed in place), with a config whose head
    counts are the shard's (the runner sizes the KV cache from them)."""
    model = loaded.model
    if isinstance(model, DeepseekV4ForCausalLM):
        if not expert_parallel:
            raise ValueError(
                "DeepSeek-V4's attention shares one KV head across all query heads (MQA) and is "
                "not split by heads here: set enable_expert_parallel=True to split its experts"
            )
        _shard_deepseek_v4(model, comm)
        return loaded
    if not isinstance(model, LlamaForCausalLM | Gemma3ForCausalLM):
        raise ValueError(f"tensor parallelism has no plan for {type(model).__name__}")
    if expert_parallel:
        raise ValueError(
            f"enable_expert_parallel splits MoE experts; {type(model).__name__} has none "
            "(tensor_parallel_size alone splits it)"
        )
    config = loaded.config
    heads = head_shard(config.num_heads, config.num_kv_heads, comm.rank, comm.world_size)
    for layer in model.layers:
        _shard_attention(layer.self_attn, heads, comm)
        _shard_mlp(layer.mlp, comm)
    shard_embedding_and_head(model, model, comm)
    config = dataclasses.replace(
        config, num_heads=len(heads.q_heads), num_kv_heads=len(heads.kv_heads)
    )
    return dataclasses.replace(loaded, config=config)


def _shard_attention(attn: nn.Module, heads: HeadShard, comm: Communicator) -> None:
    """The fused [q | k | v] rows of this rank's heads; o_proj's columns of its query heads."""
    d, q_size = attn.head_dim, attn.q_size
    q = range(heads.q_heads.start * d, heads.q_heads.stop * d)
    kv = range(heads.kv_heads.start * d, heads.kv_heads.stop * d)
    k = range(q_size + kv.start, q_size + kv.stop)
    v = range(q_size + attn.kv_size + kv.start, q_size + attn.kv_size + kv.stop)
    attn.qkv_proj = ColumnParallelLinear(attn.qkv_proj, [q, k, v])
    attn.o_proj = RowParallelLinear(attn.o_proj, q, comm)
    attn.num_heads, attn.num_kv_heads = len(heads.q_heads), len(heads.kv_heads)
    attn.q_size, attn.kv_size = len(q), len(kv)


def _shard_mlp(mlp: nn.Module, comm: Communicator) -> None:
    size = mlp.intermediate_size
    mine = balanced_range(size, comm.rank, comm.world_size)
    up = range(size + mine.start, size + mine.stop)
    mlp.gate_up_proj = ColumnParallelLinear(mlp.gate_up_proj, [mine, up])
    mlp.down_proj = RowParallelLinear(mlp.down_proj, mine, comm)
    mlp.intermediate_size = len(mine)


# ---- DeepSeek-V4: expert parallel ---------------------------------------------------------------


class ExpertParallelMoE(nn.Module):
    """A MoE layer's routed experts `experts` (a range of the expert ids) and this rank's part
    of the shared expert; the sum over the ranks is the full layer's output.

    Experts loaded for this rank already (the streaming loader reads only a rank's range) are
    kept as they are; a full set is sliced. A packed (FP8) shared expert is not split: its
    128 x 128 scale blocks need not fall on the ranks' boundaries, and it is small next to the
    routed experts (V4 Flash: ~25 MB a layer against ~3.2 GB), so rank 0 holds and computes it
    whole and the others none of it."""

    def __init__(self, moe: MoE, comm: Communicator) -> None:
        super().__init__()
        num_experts = moe.gate.weight.shape[0]
        if num_experts < comm.world_size:
            raise ValueError(
                f"the model has {num_experts} routed experts per layer; expert parallelism over "
                f"{comm.world_size} ranks would leave a rank without one"
            )
        mine = balanced_range(num_experts, comm.rank, comm.world_size)
        experts = moe.experts
        self.experts = experts if experts.expert_ids == mine else experts.sliced(mine)
        self.gate = moe.gate
        self.limit = experts.limit
        shared = moe.shared_experts
        self.shared: nn.Module | None = None
        if isinstance(shared.gate_proj, Fp8Linear):
            self.shared = shared if comm.rank == 0 else None
        else:
            size = shared.gate_proj.weight.shape[0]
            part = balanced_range(size, comm.rank, comm.world_size)
            self.shared = MLP.__new__(MLP)
            nn.Module.__init__(self.shared)
            self.shared.limit = shared.limit
            self.shared.gate_proj = ColumnParallelLinear(shared.gate_proj, [part])
            self.shared.up_proj = ColumnParallelLinear(shared.up_proj, [part])
            self.shared.down_proj = _Columns(shared.down_proj, part)
        self.comm = comm

    def forward(self, x: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        indices, weights = self.gate(x, input_ids)  # (T, top_k) each, the same on every rank
        out = self.experts(x, indices, weights)  # (T, hidden): a partial sum
        if self.shared is not None:
            out = out + self.shared(x)
        return self.comm.all_reduce(out)


class _Columns(nn.Module):
    """The input columns `columns` of a bias-free linear layer, no reduction (the caller's)."""

    def __init__(self, linear: nn.Linear, columns: range) -> None:
        super().__init__()
        weight = linear.weight.data[:, columns.start : columns.stop].clone()
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


def _shard_deepseek_v4(model: DeepseekV4ForCausalLM, comm: Communicator) -> None:
    for layer in model.model.layers:
        layer.mlp = ExpertParallelMoE(layer.mlp, comm)
    shard_embedding_and_head(model, model.model, comm)
