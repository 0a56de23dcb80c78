"""The memory plan of one rank: weights, the activation/runtime reserve, the KV pools, how many
KV tokens and talk-sized decisions fit, and whether it all fits the device (vLLM's start-up
lines: model weights, KV cache, maximum concurrency).

The plan is computed from an EngineConfig and the device's memory alone. Its KV budget is either
what the config says (`kv_budget="configured"`: the engine at start) or everything left after
the weights and the reserve (`kv_budget="rest"`: the command, as vLLM sizes its cache).

The activation/runtime reserve it assumes is memory_plan/reserve.py's (stated in the table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from inference.engine.config import EngineConfig
from inference.engine.memory_plan.kv import KVLayout, kv_layout
from inference.engine.memory_plan.model_spec import ModelSpec, model_spec
from inference.engine.memory_plan.reserve import reserve_bytes
from inference.engine.memory_plan.weights import Sharding, WeightBytes, weight_bytes

# The talk's decision: a 12,310-token prompt and ~51 output tokens.
TALK_PROMPT_TOKENS = 12_310
TALK_OUTPUT_TOKENS = 51
GIB = 1 << 30
_FORMAT_LABELS = {
    "fp4": "FP4 e2m1 + e8m0 per 32",
    "fp8": "FP8 e4m3 + fp32 per 128x128",
    "int8": "int8 (QuantizedLinear)",
    "int4": "int4 (QuantizedLinear)",
}


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    model: str
    device: str
    tensor_parallel_size: int
    expert_parallel: bool
    dtype: str
    weight_formats: dict[str, str]  # kind → how it is held
    weights: WeightBytes
    kv: KVLayout
    device_memory_bytes: int
    reserve_bytes: int
    reserve_note: str  # what the reserve assumes
    kv_budget_bytes: int
    num_blocks: int
    num_window_blocks: int
    max_model_len: int
    max_concurrent_requests: int
    required_bytes: int  # weights + reserve + the KV the plan needs (configured, or one talk)

    @property
    def kv_tokens_per_rank(self) -> int:
        """Prefix tokens the full group holds (the sliding group holds windows, not prefixes)."""
        return self.num_blocks * self.kv.block_size

    @property
    def kv_bytes_per_token_per_rank(self) -> float:
        """What a token of KV capacity costs in this pool layout (both groups)."""
        full, sliding = (
            self.kv.group_block_bytes["full"],
            self.kv.group_block_bytes.get("sliding", 0),
        )
        if not self.num_blocks:  # no pool: what a token would cost with equal counts
            return (full + sliding) / self.kv.block_size
        used = self.num_blocks * full + self.num_window_blocks * sliding
        return used / self.kv_tokens_per_rank

    @property
    def fits(self) -> bool:
        return self.shortfall_bytes == 0

    @property
    def shortfall_bytes(self) -> int:
        return max(self.required_bytes - self.device_memory_bytes, 0)

    def shortfall_message(self) -> str:
        """Why it does not fit, with the parts that make up what is needed ("" when it fits)."""
        if self.fits:
            return ""
        need = self.required_bytes
        kv = need - self.weights.total - self.reserve_bytes
        text = (
            f"{self.model} does not fit: a rank needs {_gib(need)} (weights "
            f"{_gib(self.weights.total)} + reserve {_gib(self.reserve_bytes)} + KV {_gib(kv)}) but "
            f"has {_gib(self.device_memory_bytes)}: short by {_gib(self.shortfall_bytes)}"
        )
        if self.weights.total + self.reserve_bytes > self.device_memory_bytes:
            hint = (
                "the weights alone do not fit: split the model over more ranks "
                "(--tensor-parallel-size N, --enable-expert-parallel for MoE models) or use a "
                "device with more memory"
            )
            if self.expert_parallel or self.tensor_parallel_size > 1:
                hint = "the weights alone do not fit: use more ranks or more memory per rank"
            return f"{text}; {hint}"
        return f"{text}; lower the KV budget (kv_cache_memory_bytes) or give the rank more memory"

    def as_json(self) -> dict:
        return {
            "model": self.model,
            "device": self.device,
            "tensor_parallel_size": self.tensor_parallel_size,
            "enable_expert_parallel": self.expert_parallel,
            "dtype": self.dtype,
            "weights_bytes_per_rank": self.weights.total,
            "weights_bytes_by_kind": self.weights.as_dict(),
            "weight_formats": self.weight_formats,
            "kv_cache_dtype": self.kv.dtype,
            "kv_bytes_per_token_per_rank": self.kv_bytes_per_token_per_rank,
            "kv_bytes_per_token_by_kind": {k.name: k.bytes_per_token for k in self.kv.kinds},
            "kv_group_block_bytes": self.kv.group_block_bytes,
            "window_checkpoint_bytes": self.kv.checkpoint_bytes,
            "block_size": self.kv.block_size,
            "reserve_bytes": self.reserve_bytes,
            "reserve_note": self.reserve_note,
            "device_memory_bytes": self.device_memory_bytes,
            "kv_budget_bytes": self.kv_budget_bytes,
            "num_blocks": self.num_blocks,
            "num_window_blocks": self.num_window_blocks,
            "kv_tokens_per_rank": self.kv_tokens_per_rank,
            "talk_prompt_tokens": TALK_PROMPT_TOKENS,
            "talk_output_tokens": TALK_OUTPUT_TOKENS,
            "max_concurrent_requests": self.max_concurrent_requests,
            "required_bytes": self.required_bytes,
            "fits": self.fits,
            "shortfall_bytes": self.shortfall_bytes,
            "shortfall": self.shortfall_message(),
        }

    def table(self) -> str:
        parallel = f"tensor parallel {self.tensor_parallel_size}"
        if self.expert_parallel:
            parallel += ", expert parallel"
        lines = [
            f"memory plan for {self.model} on {self.device} ({parallel}), per rank:",
            f"  weights                      {_gib(self.weights.total):>12}  "
            f"({self.weights.total / 1e9:,.1f} GB)",
        ]
        for kind, size in self.weights.as_dict().items():
            lines.append(f"    {kind:<26} {_gib(size):>12}  {self.weight_formats[kind]}")
        lines.append(f"  KV/state per token ({self.kv.dtype}, block {self.kv.block_size})")
        for kind in self.kv.kinds:
            lines.append(f"    {kind.name:<58} {kind.bytes_per_token:>10,.0f} B  [{kind.group}]")
        if self.kv.window is not None:
            lines.append(
                f"    per window checkpoint / per running request's window  "
                f"{_mib(self.kv.checkpoint_bytes)} / "
                f"{_mib(self.kv.window_blocks_per_request * self.kv.group_block_bytes['sliding'])}"
            )
        lines += [
            f"    a token of KV capacity (both pools){self.kv_bytes_per_token_per_rank:>29,.0f} B",
            f"  activation/runtime reserve   {_gib(self.reserve_bytes):>12}  ({self.reserve_note})",
            f"  KV budget                    {_gib(self.kv_budget_bytes):>12}  "
            f"({self.num_blocks} blocks, {self.num_window_blocks} window blocks)",
            f"  KV tokens that fit           {self.kv_tokens_per_rank:>12,}",
            f"  talk-sized decisions at once {self.max_concurrent_requests:>12}  "
            f"({TALK_PROMPT_TOKENS:,}-token prompt + {TALK_OUTPUT_TOKENS} output tokens each)",
            f"  device memory                {_gib(self.device_memory_bytes):>12}",
            f"  fits: {'yes' if self.fits else 'no: ' + self.shortfall_message()}",
        ]
        if self.max_model_len <= TALK_PROMPT_TOKENS:
            lines.append(
                f"  (a talk-sized prompt exceeds the model's context of {self.max_model_len})"
            )
        return "\n".join(lines)


def plan_memory(config: EngineConfig, device_memory_bytes: int, kv_budget: str) -> MemoryPlan:
    """Rank 0's plan (it holds the largest shares) for `config` on a device of this memory.
    kv_budget: "configured" (the config's KV budget) or "rest" (all that is left)."""
    from inference.engine.models import resolve_weights

    if kv_budget not in ("configured", "rest"):
        raise ValueError(f"kv_budget must be 'configured' or 'rest', got {kv_budget!r}")
    spec = model_spec(config.model)
    parallel, running, cache = config.parallel, config.runner, config.cache
    sharding = Sharding(parallel.tensor_parallel_size, parallel.enable_expert_parallel)
    device_type = "cuda" if config.device.startswith("cuda") else "cpu"
    dtype = getattr(torch, running.dtype)
    formats = resolve_weights(running.weights, spec.arch, torch.device(device_type))
    weights = weight_bytes(spec, dtype, sharding, formats)
    # The dtype the engine holds the state in (DeepSeek-V4: the model's, whatever
    # kv_cache_dtype says): the model's PagedStateSpec decides, as in engine_builder.
    state = spec.config.paged_state_spec()
    kv_dtype = getattr(torch, state.state_dtype(running.dtype, running.kv_cache_dtype))
    kv = kv_layout(spec, kv_dtype, cache.block_size, sharding)
    max_len = min(config.scheduler.max_model_len or spec.max_model_len, spec.max_model_len)
    reserve, reserve_note = reserve_bytes(spec, config, device_type, max_len)
    talk = min(TALK_PROMPT_TOKENS + TALK_OUTPUT_TOKENS, max_len)
    chunk = config.scheduler.max_num_batched_tokens
    talk_budget = _budget_for(kv, cache, talk, chunk)
    if kv_budget == "configured":
        budget = _configured_budget(kv, cache)
        required_kv = budget
    else:
        budget = max(device_memory_bytes - weights.total - reserve, 0)
        required_kv = talk_budget
    num_blocks, num_window = _block_counts(kv, cache, budget, kv_budget == "configured")
    concurrent = _max_concurrent(kv, num_blocks, num_window, talk, chunk)
    if max_len <= TALK_PROMPT_TOKENS:
        concurrent = 0  # the talk's prompt does not fit the model's context at all
    return MemoryPlan(
        model=config.model,
        device=device_type,
        tensor_parallel_size=parallel.tensor_parallel_size,
        expert_parallel=parallel.enable_expert_parallel,
        dtype=running.dtype,
        weight_formats=_weight_formats(spec, formats, running.dtype),
        weights=weights,
        kv=kv,
        device_memory_bytes=int(device_memory_bytes),
        reserve_bytes=reserve,
        reserve_note=reserve_note,
        kv_budget_bytes=budget,
        num_blocks=num_blocks,
        num_window_blocks=num_window,
        max_model_len=max_len,
        max_concurrent_requests=concurrent,
        required_bytes=weights.total + reserve + required_kv,
    )


def _weight_formats(spec: ModelSpec, formats: str, dtype: str) -> dict[str, str]:
    packed = spec.formats
    linears = packed.linears if spec.arch == "deepseek_v4" else formats
    head = "int8" if spec.arch != "deepseek_v4" and formats != "fp32" else dtype
    return {
        "experts": _FORMAT_LABELS.get(packed.experts, dtype) if spec.arch == "deepseek_v4" else "-",
        "linears": _FORMAT_LABELS.get(linears, dtype),
        "embeddings": f"{dtype} embedding, {head} head",
        "other": f"{dtype}: norms, routers, mHC, small projections; integer buffers as is",
    }


# ---- the KV pools (as engine_builder.kv_block_counts sizes them) -----------------------------


def _configured_budget(kv: KVLayout, cache) -> int:
    if cache.num_kv_blocks is None:
        return cache.kv_cache_memory_bytes
    num_window = cache.num_window_blocks or cache.num_kv_blocks
    return cache.num_kv_blocks * kv.group_block_bytes[
        "full"
    ] + num_window * kv.group_block_bytes.get("sliding", 0)


def _block_counts(kv: KVLayout, cache, budget: int, configured: bool) -> tuple[int, int]:
    """(full blocks, window blocks) from the budget: equal counts, or the window group's own
    share (window_cache_fraction); explicit block counts win where the config gives them."""
    full, sliding = kv.group_block_bytes["full"], kv.group_block_bytes.get("sliding", 0)
    if configured and cache.num_kv_blocks is not None:
        return cache.num_kv_blocks, cache.num_window_blocks or cache.num_kv_blocks
    if cache.window_cache_fraction is not None and sliding:
        num_blocks = int(budget * (1 - cache.window_cache_fraction)) // full
        return num_blocks, int(budget * cache.window_cache_fraction) // sliding
    num_blocks = budget // (full + sliding)
    return num_blocks, (cache.num_window_blocks or num_blocks) if sliding else num_blocks


def _budget_for(kv: KVLayout, cache, num_tokens: int, chunk: int) -> int:
    """The smallest KV budget that serves one request of num_tokens (prefilled in chunks)."""
    full, sliding = kv.group_block_bytes["full"], kv.group_block_bytes.get("sliding", 0)
    full_blocks = math.ceil(num_tokens / kv.block_size)
    window_blocks = (
        kv.window_blocks_per_request + math.ceil(chunk / kv.block_size) if sliding else 0
    )
    if cache.window_cache_fraction is not None and sliding:
        fraction = cache.window_cache_fraction
        return math.ceil(
            max(full_blocks * full / (1 - fraction), window_blocks * sliding / fraction)
        )
    return max(full_blocks, window_blocks) * (full + sliding)


def _max_concurrent(kv: KVLayout, num_blocks: int, num_window: int, tokens: int, chunk: int) -> int:
    """Requests of `tokens` that run at once: each holds its prefix in the full group and its
    window in the sliding group (one prefill chunk's extra window blocks at a time)."""
    count = num_blocks // math.ceil(tokens / kv.block_size)
    if kv.window is not None:
        spare = num_window - math.ceil(chunk / kv.block_size)
        count = min(count, max(spare, 0) // kv.window_blocks_per_request)
    return count


def _gib(size: float) -> str:
    return f"{size / GIB:,.2f} GiB"


def _mib(size: float) -> str:
    return f"{size / (1 << 20):,.1f} MiB"
