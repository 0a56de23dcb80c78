"""Assembling an engine from its EngineConfig: load the model (this rank's shard of it), size the
KV cache, and build the KV cache manager, pinned heads, scheduler, structured-output manager,
runner and KV tiers. Each component gets its own sub-config, plus the facts only the loaded
model and the memory budget decide (the KV cache's KVCacheSpec, the resolved max_model_len);
LLMEngine only runs what this returns.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch

from inference.engine.attention.paged_state import PagedStateSpec
from inference.engine.config import CacheConfig, EngineConfig
from inference.engine.core.scheduler import Scheduler
from inference.engine.distributed.executor import TensorParallelExecutor
from inference.engine.kv.kv_cache_manager import BoundedReplay, KVCacheManager, KVCacheSpec
from inference.engine.kv.pinned_heads import PinnedHeads
from inference.engine.kv.tiers.block_file import BlockLayout
from inference.engine.kv.tiers.disk_tier import DiskTier
from inference.engine.kv.tiers.group_io import GroupIO
from inference.engine.kv.tiers.host_tier import HostTier
from inference.engine.kv.tiers.offloader import KVOffloader
from inference.engine.loading.shard import Shard
from inference.engine.memory_plan import check_engine
from inference.engine.models import load_model
from inference.engine.runner.model_runner import ModelRunner, RunnerSetup
from inference.engine.spec_decode import Drafter
from inference.engine.spec_decode.mtp import MtpDrafter
from inference.engine.spec_decode.ngram import NgramProposer
from inference.engine.structured_output.structured_output import StructuredOutputManager

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class EngineParts:
    """What LLMEngine runs, and what it reports about how it was sized."""

    memory_plan: Any  # memory_plan's plan, logged and checked before a byte of weights is read
    weights: str  # "auto" resolved: what every request's metrics report
    kv_cache_dtype: str  # what every request's metrics report
    tokenizer: Any
    model_config: Any
    max_model_len: int
    num_blocks: int
    num_window_blocks: int
    sliding_block_bytes: int  # bytes one sliding-group block holds across the sliding layers
    kv_cache_manager: KVCacheManager
    pinned: PinnedHeads
    scheduler: Scheduler
    structured: StructuredOutputManager
    runner: ModelRunner | TensorParallelExecutor
    offloader: KVOffloader | None


def build_engine(
    config: EngineConfig, device: torch.device, executor: TensorParallelExecutor | None
) -> EngineParts:
    """Every component of an engine on `device`; with an `executor` this is rank 0 of a
    tensor-parallel engine and the runner is the executor."""
    cache, scheduling, running = config.cache, config.scheduler, config.runner
    # Logged, and refused when it does not fit, before a byte of weights is read.
    memory_plan = check_engine(config)
    parallel = config.parallel
    # Under expert parallelism rank 0 reads only its share of the routed experts.
    shard = Shard(0, parallel.tensor_parallel_size) if parallel.enable_expert_parallel else None
    loaded = load_model(config.model, device, config.seed, running.weights, shard=shard)
    weights = loaded.weights
    if executor is not None:
        loaded = executor.shard(loaded)  # the KV cache below is this rank's shard too
    max_model_len = min(scheduling.max_model_len or loaded.max_model_len, loaded.max_model_len)
    state_spec = loaded.config.paged_state_spec()  # what the model's paged state is
    kv_cache_dtype = state_spec.state_dtype(running.dtype, running.kv_cache_dtype)
    if kv_cache_dtype != running.kv_cache_dtype:
        logger.warning(
            "%s keeps its attention state in %s: kv_cache_dtype=%s does not apply to it",
            type(loaded.model).__name__,
            kv_cache_dtype,
            running.kv_cache_dtype,
        )
    dtype = getattr(torch, kv_cache_dtype)
    # The sizes count fp32: a bf16 cache fits twice the blocks in the budget.
    group_bytes = {
        group: size * dtype.itemsize // 4
        for group, size in state_spec.group_block_bytes(cache.block_size).items()
    }
    # A running request holds its window plus one prefill chunk in the sliding group (with
    # equal counts, the check of a prompt against num_blocks covers it).
    window = state_spec.sliding_window or 0
    min_window = -(-(window + scheduling.max_num_batched_tokens) // cache.block_size) + 1
    num_blocks, num_window_blocks = kv_block_counts(
        cache, group_bytes, has_window_budget=state_spec.has_window_budget
    )
    if num_window_blocks != num_blocks and num_window_blocks < min_window:
        raise ValueError(
            f"the window group has {num_window_blocks} blocks; one request's window "
            f"({window} tokens) plus a prefill chunk ({scheduling.max_num_batched_tokens}) "
            f"needs {min_window}: raise its budget or lower max_num_batched_tokens"
        )
    spec = KVCacheSpec(
        num_blocks,
        loaded.fingerprint,
        sliding_window=_sliding_window(config, state_spec),
        num_sliding_blocks=num_window_blocks,
        bounded_replay=_bounded_replay(config, state_spec),
    )
    kv_cache_manager = KVCacheManager(cache, spec)
    scheduler = Scheduler(
        dataclasses.replace(scheduling, max_model_len=max_model_len),
        kv_cache_manager,
        tokenizer=loaded.tokenizer,
        drafter=_drafter(config, loaded.model.has_mtp),
        num_speculative_tokens=config.speculative.num_speculative_tokens,
    )
    structured = StructuredOutputManager(
        loaded.tokenizer, loaded.config.vocab_size, config.structured_output
    )
    setup = RunnerSetup(
        block_size=cache.block_size,
        num_blocks=num_blocks,
        num_window_blocks=num_window_blocks,
        max_model_len=max_model_len,
        max_num_seqs=scheduling.max_num_seqs,
        draft_with_mtp=config.speculative.speculative_method == "mtp",
    )
    runner = ModelRunner(loaded, running, setup, device, structured)
    if executor is not None:
        executor.attach(runner, setup)
    runner = executor or runner
    offloader = None
    if cache.has_tiers:
        offloader = _kv_offloader(
            config, state_spec, runner, executor, kv_cache_manager, loaded.fingerprint, dtype
        )
    return EngineParts(
        memory_plan=memory_plan,
        weights=weights,
        kv_cache_dtype=kv_cache_dtype,
        tokenizer=loaded.tokenizer,
        model_config=loaded.config,
        max_model_len=max_model_len,
        num_blocks=num_blocks,
        num_window_blocks=num_window_blocks,
        sliding_block_bytes=group_bytes.get("sliding", 0),
        kv_cache_manager=kv_cache_manager,
        pinned=PinnedHeads(kv_cache_manager, cache.max_pinned_fraction),
        scheduler=scheduler,
        structured=structured,
        runner=runner,
        offloader=offloader,
    )


def kv_block_counts(
    cache: CacheConfig, group_bytes: dict[str, int], *, has_window_budget: bool
) -> tuple[int, int]:
    """Blocks of the full group and of the window (sliding) group: the same count for both,
    or, for a state whose window group may have a budget of its own (`has_window_budget`),
    each its own budget (`window_cache_fraction` of the bytes, or `num_window_blocks`)."""
    separate = cache.window_cache_fraction is not None or cache.num_window_blocks is not None
    if separate and not (has_window_budget and "sliding" in group_bytes):
        raise ValueError(
            "window_cache_fraction / num_window_blocks give the window group its own budget; "
            "only DeepSeek-V4 models support that so far"
        )
    budget = cache.kv_cache_memory_bytes
    if cache.num_kv_blocks is not None:
        num_blocks = cache.num_kv_blocks
        num_window = cache.num_window_blocks or num_blocks
    elif cache.window_cache_fraction is not None:
        num_blocks = int(budget * (1 - cache.window_cache_fraction)) // group_bytes["full"]
        num_window = int(budget * cache.window_cache_fraction) // group_bytes["sliding"]
    else:
        num_blocks = num_window = budget // sum(group_bytes.values())
        num_window = cache.num_window_blocks or num_window
    for name, count, size in (
        ("full", num_blocks, group_bytes["full"]),
        ("window", num_window, group_bytes.get("sliding", 0)),
    ):
        if count < 2:
            raise ValueError(
                f"the KV budget holds {count} {name}-group blocks of {size} bytes; at least 2 "
                "are needed: raise kv_cache_memory_bytes (or the group's share of it)"
            )
    return num_blocks, num_window


def _kv_tiers_unsupported(
    config: EngineConfig, state_spec: PagedStateSpec, is_parallel: bool
) -> str | None:
    """Why the KV tiers cannot store this engine's KV, or None when they can."""
    if is_parallel:
        return (
            "the KV tiers do not read a tensor-parallel engine's KV shards yet; use them "
            "with tensor_parallel_size=1"
        )
    if state_spec.kv_tiers_unsupported is not None:
        return f"model {config.model} {state_spec.kv_tiers_unsupported}"
    return None


def _kv_offloader(
    config: EngineConfig,
    state_spec: PagedStateSpec,
    runner: ModelRunner | TensorParallelExecutor,
    executor: TensorParallelExecutor | None,
    kv_cache_manager: KVCacheManager,
    fingerprint: str,
    dtype: torch.dtype,
) -> KVOffloader | None:
    """The tiers below the device pool (kv/tiers), for every KV cache group."""
    cache = config.cache
    unsupported = _kv_tiers_unsupported(config, state_spec, executor is not None)
    if unsupported and cache.kv_tiers_where_supported:
        logger.info("KV tiers off for this engine: %s", unsupported)
        return None
    if unsupported:
        raise ValueError(f"kv_host_cache_bytes / kv_disk_cache_dir: {unsupported}")

    def group(name: str) -> GroupIO:
        shape = runner.block_shape(name)
        layout = BlockLayout(fingerprint, name, cache.block_size, shape, str(dtype)[6:])
        manager = kv_cache_manager.coordinator.full
        if name == "sliding":
            manager = kv_cache_manager.sliding
        return GroupIO(
            layout,
            manager,
            lambda block_ids: runner.read_blocks(name, block_ids),
            lambda block_ids, payload: runner.write_blocks(name, block_ids, payload),
        )

    host = HostTier(cache.kv_host_cache_bytes) if cache.kv_host_cache_bytes else None
    disk = None
    if cache.kv_disk_cache_dir is not None:
        disk = DiskTier(
            cache.kv_disk_cache_dir,
            cache.kv_disk_cache_bytes,
            cache.kv_disk_cache_ttl_s,
            key=cache.disk_cache_key,
        )
    sliding = group("sliding") if kv_cache_manager.sliding is not None else None
    return KVOffloader(
        group("full"),
        sliding,
        host=host,
        disk=disk,
        load_timeout_s=cache.kv_disk_load_timeout_s,
    )


def _drafter(config: EngineConfig, has_mtp: bool) -> Drafter | None:
    speculative = config.speculative
    if speculative.speculative_method is None:
        return None
    if speculative.speculative_method == "mtp":
        if not has_mtp:
            raise ValueError(
                "speculative_method='mtp' needs a model with a multi-token-prediction "
                f"layer; model {config.model} has none (DeepSeek-V4 checkpoints with "
                "num_nextn_predict_layers ≥ 1 do): use 'ngram'"
            )
        return MtpDrafter()
    return NgramProposer(speculative.prompt_lookup_min, speculative.prompt_lookup_max)


def _bounded_replay(config: EngineConfig, state_spec: PagedStateSpec) -> BoundedReplay | None:
    if not config.cache.enable_bounded_replay:
        return None
    alignment = state_spec.replay_alignment
    if alignment is None:
        raise ValueError(
            f"enable_bounded_replay is DeepSeek's scheme for DeepSeek-V4; model "
            f"{config.model} has no compressed state to replay over"
        )
    return BoundedReplay(int(state_spec.sliding_window), int(alignment))


def _sliding_window(config: EngineConfig, state_spec: PagedStateSpec) -> int | None:
    """The window of the model's sliding layers (None: it has none, the retention interval
    changes nothing and we say so)."""
    groups = state_spec.kv_groups
    if "sliding" not in groups:
        if config.cache.retention_interval is not None:
            logger.warning(
                "retention_interval=%s changes nothing: model %s has no sliding-window "
                "layers (every layer keeps all its KV, so every cached block is reusable)",
                config.cache.retention_interval,
                config.model,
            )
        return None
    if "full" not in groups:
        raise ValueError(
            f"model {config.model} has only sliding-window layers; the engine needs "
            "at least one full-attention layer to chain its prefix cache"
        )
    return int(state_spec.sliding_window)
