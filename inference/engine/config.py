"""EngineConfig: every engine knob, validated, in six groups — the KV cache, the scheduler, the
model runner, structured output, parallelism and speculative decoding — each its own dataclass
checked in its own __post_init__ (vLLM's CacheConfig / SchedulerConfig / ...), plus what spans
them (model, device, seed).

Every sub-config field is also taken, and read, by its flat name: EngineConfig(
enable_prefix_caching=False) sets `config.cache.enable_prefix_caching`, and
`config.enable_prefix_caching` reads it back (the experiment, the benches and Django's
INFERENCE_ENGINE pass flat names). Readers inside the engine use the sub-configs.

Django settings become an EngineConfig in one place (inference/completions/runtime.py);
nothing in the engine reads the environment or settings.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from typing import Any

from inference.engine.kv.retention import check_retention_interval
from inference.engine.loading.model_files import known_model_names
from inference.engine.structured_output.schema_limits import SchemaLimits

_DEVICES = ("cpu", "cuda")
_DTYPES = ("auto", "float32", "bfloat16", "float16")
_ATTENTION_BACKENDS = ("auto", "torch", "triton")
_SPECULATIVE_METHODS = (None, "ngram", "mtp")
# Linear-layer weights: fp32 (the exact reference), weight-only int8 / int4 on torch's CPU
# kernels (models/quantized_linear.py), or "auto": resolved at load (models.resolve_weights).
WEIGHT_FORMATS = ("fp32", "int8", "int4", "auto")
MIN_KV_KEY_BYTES = 16


@dataclass(slots=True)
class CacheConfig:
    """The KV cache: its blocks and memory, prefix caching and how far reuse reaches."""

    block_size: int = 16
    # KV memory: an explicit block count wins over the byte budget. A sliding-window model's two
    # KV groups get the same number of blocks (the budget is split by layer count).
    kv_cache_memory_bytes: int = 1 << 30
    num_kv_blocks: int | None = None
    # A budget of its own for the sliding (window) group, so short-lived window state never
    # crowds out long-lived prefixes (DeepSeek-V4 only so far, where a window block is ~24x a
    # compressed-entry block): its share of kv_cache_memory_bytes, or with num_kv_blocks its
    # block count. None: both groups get the same number of blocks.
    window_cache_fraction: float | None = None
    num_window_blocks: int | None = None
    # The memory one rank may use (bytes), checked at start by the memory plan (weights + the
    # activation reserve + the KV budget must fit; memory_plan/): None measures it (CUDA: free
    # device memory; CPU: the host's available memory, shared by spawned ranks).
    device_memory_bytes: int | None = None
    enable_prefix_caching: bool = True
    # Sliding-window models only (vLLM's --prefix-cache-retention-interval): where the window's
    # state is kept for reuse. None: every block (dense); 0: where each prompt ends; N > 0:
    # multiples of N (a multiple of block_size). Reuse rounds down to this grid.
    retention_interval: int | None = None
    # Chat messages marked "cache": True end in a cache breakpoint (a window checkpoint kept
    # exactly there). Off: the marks are ignored, as vLLM does (SamplingParams still count).
    enable_chat_breakpoints: bool = True
    # Token-exact reuse: a match that ends inside a block copies that block's matching slots
    # into a fresh block (copy-on-write) instead of recomputing the block. Off: block-rounded.
    enable_partial_block_reuse: bool = True
    # Junction checkpoints: when a prompt leaves a cached one inside the cached range, keep the
    # window state where it leaves, so the next prompt with that head resumes there exactly.
    enable_junction_checkpoints: bool = True
    # DeepSeek's bounded replay (DeepSeek-V4 only; approximate, off by default): a prefix whose
    # window state was not kept resumes a window early over the cached compressed state, the
    # window recomputed with its sliding attention limited to the replayed span. Such hits are
    # reported as reuse_source "replay" and never feed the exact cache.
    enable_bounded_replay: bool = False
    # LLMEngine.warm(pin=True): the share of the KV blocks pinned heads may hold.
    max_pinned_fraction: float = 0.5
    # Tiers below the device pool (kv/tiers): full blocks are written down in the background
    # and a device-pool miss is loaded from host memory, then disk. 0 / None: tier off.
    kv_host_cache_bytes: int = 0
    # A directory every engine of the deployment may share (a shared mount across machines).
    kv_disk_cache_dir: str | None = None
    kv_disk_cache_bytes: int = 20 << 30
    # Blocks not used for this long are deleted (last use: written or hit).
    kv_disk_cache_ttl_s: float = 3 * 86400.0
    # The deployment's secret for the disk tier's files (HMAC-SHA256, kv/tiers/block_file): the
    # same on every engine that shares kv_disk_cache_dir; a file without its MAC is refused.
    # None: a random key per engine (one warning), so no file is trusted across engines.
    kv_disk_cache_key: str | bytes | None = field(default=None, repr=False)
    # A load from the tiers that has read no block for this long is given up and the request
    # recomputes (a stuck network mount, a file that never answers); reads failing in a row
    # turn the disk tier off (kv/tiers/disk_tier).
    kv_disk_load_timeout_s: float = 5.0
    # Where the tiers cannot store an engine's KV yet (a tensor-parallel engine's shards):
    # False refuses such an engine; True runs it without the tiers and logs why (a deployment
    # default that should not stop a worker from starting).
    kv_tiers_where_supported: bool = False

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two ≥ 1, got {self.block_size}")
        check_retention_interval(self.retention_interval, self.block_size)
        if not 0 <= self.max_pinned_fraction < 1:
            raise ValueError(
                f"max_pinned_fraction must be in [0, 1) (a share of the KV blocks), got "
                f"{self.max_pinned_fraction}"
            )
        if self.window_cache_fraction is not None and not 0 < self.window_cache_fraction < 1:
            raise ValueError(
                "window_cache_fraction must be in (0, 1) (the window group's share of "
                f"kv_cache_memory_bytes), got {self.window_cache_fraction}"
            )
        if self.num_window_blocks is not None and self.num_window_blocks < 2:
            raise ValueError(f"num_window_blocks must be ≥ 2, got {self.num_window_blocks}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks must be ≥ 2, got {self.num_kv_blocks}")
        if self.device_memory_bytes is not None and (
            not isinstance(self.device_memory_bytes, int) or self.device_memory_bytes < 1
        ):
            raise ValueError(
                "device_memory_bytes must be a positive int (the bytes one rank may use) or None "
                f"(measured at start), got {self.device_memory_bytes!r}"
            )
        self._check_tiers()
        if self.num_kv_blocks is None and self.kv_cache_memory_bytes < 1 << 20:
            raise ValueError(
                f"kv_cache_memory_bytes must be at least 1 MiB, got {self.kv_cache_memory_bytes}"
            )

    def _check_tiers(self) -> None:
        if not isinstance(self.kv_host_cache_bytes, int) or self.kv_host_cache_bytes < 0:
            raise ValueError(
                f"kv_host_cache_bytes must be an int ≥ 0 (0: no host-memory tier), got "
                f"{self.kv_host_cache_bytes!r}"
            )
        directory = self.kv_disk_cache_dir
        if directory is not None:
            if isinstance(directory, os.PathLike):
                directory = os.fspath(directory)
            if not isinstance(directory, str) or not directory.strip():
                raise ValueError(
                    f"kv_disk_cache_dir must be a directory path or None (no disk tier), got "
                    f"{self.kv_disk_cache_dir!r}"
                )
            self.kv_disk_cache_dir = directory
        if not isinstance(self.kv_disk_cache_bytes, int) or self.kv_disk_cache_bytes < 1 << 20:
            raise ValueError(
                f"kv_disk_cache_bytes must be at least 1 MiB, got {self.kv_disk_cache_bytes!r}"
            )
        if not 0 < self.kv_disk_cache_ttl_s < float("inf"):
            raise ValueError(
                f"kv_disk_cache_ttl_s must be a finite number of seconds > 0, got "
                f"{self.kv_disk_cache_ttl_s!r}"
            )
        key = self.kv_disk_cache_key
        if key is not None and (
            not isinstance(key, str | bytes) or len(self.disk_cache_key) < MIN_KV_KEY_BYTES
        ):
            raise ValueError(
                f"kv_disk_cache_key must be a secret (str or bytes) of at least "
                f"{MIN_KV_KEY_BYTES} bytes, the same on every engine that shares "
                "kv_disk_cache_dir (e.g. python -c 'import secrets; print(secrets.token_hex(32))'"
                f"), or None (a random key per engine); got a {type(key).__name__} too short "
                "or of another type"
            )
        if not 0 < self.kv_disk_load_timeout_s < float("inf"):
            raise ValueError(
                f"kv_disk_load_timeout_s must be a finite number of seconds > 0, got "
                f"{self.kv_disk_load_timeout_s!r}"
            )
        if self.has_tiers and not self.enable_prefix_caching:
            raise ValueError(
                "kv_host_cache_bytes / kv_disk_cache_dir keep prefix-cache blocks below the "
                "device pool; they need enable_prefix_caching=True"
            )

    @property
    def disk_cache_key(self) -> bytes | None:
        """kv_disk_cache_key as bytes (a str is taken as UTF-8)."""
        key = self.kv_disk_cache_key
        return key.encode() if isinstance(key, str) else key

    @property
    def has_tiers(self) -> bool:
        """Whether a host-memory or disk tier is on."""
        return self.kv_host_cache_bytes > 0 or self.kv_disk_cache_dir is not None


@dataclass(slots=True)
class SchedulerConfig:
    """Batching: how many requests and tokens a step takes, and what a step's tokens do."""

    max_num_seqs: int = 8
    max_num_batched_tokens: int = 1024
    # Shorter than the model's own context is allowed; longer is an error at load time.
    max_model_len: int | None = None
    # One prefill per shared head: requests waiting together on the same uncached head wait
    # for the first of them to compute it (see shared_prefill). Off: each prefills its own.
    enable_shared_prefill: bool = True
    # JSON-schema output: append the tokens the grammar forces without a model step of their own.
    enable_jump_forward: bool = True
    # While some request is decoding, a prefill chunk is at most this many tokens, so decodes
    # are not stalled behind a full max_num_batched_tokens chunk (None: no cap). Measured:
    # docs/PERFORMANCE.md, "Quantized weights and a leaner decode step".
    prefill_chunk_while_decoding: int | None = None

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be ≥ 1, got {self.max_num_seqs}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be ≥ 2, got {self.max_model_len}")
        chunk = self.prefill_chunk_while_decoding
        if chunk is not None and not 1 <= chunk <= self.max_num_batched_tokens:
            raise ValueError(
                f"prefill_chunk_while_decoding must be in [1, max_num_batched_tokens="
                f"{self.max_num_batched_tokens}] (or None), got {chunk}"
            )


@dataclass(slots=True)
class RunnerConfig:
    """How the model runs: precision, attention path, CUDA graphs, CPU threads."""

    # Weights and activations. "auto": float32 on CPU (no fast bf16 there), bfloat16 on CUDA.
    dtype: str = "auto"
    # The KV cache. "auto": `dtype`. "bfloat16" on the CPU halves the bytes every decode step
    # reads (its attention runs in bfloat16 with float32 accumulation; the rest of the model stays
    # float32): the fast path's, not the exact reference's (docs/PERFORMANCE.md, "A bfloat16 KV
    # cache"). On CUDA it must be `dtype` (the kernels read the model's dtype). DeepSeek-V4 keeps
    # its own state in `dtype` whatever this says (a log line says so).
    kv_cache_dtype: str = "auto"
    # "auto": the triton kernels on CUDA, the torch path on CPU. "triton" on CPU runs the kernels
    # under triton's interpreter (TRITON_INTERPRET=1 before triton is imported): for tests.
    attention_backend: str = "auto"
    # Decode steps replayed from CUDA graphs (batch sizes 1, 2, 4, ... 64); CUDA + triton only.
    enable_cuda_graphs: bool = True
    # Torch path: all decoding sequences of a step read their contexts together, one masked
    # attention call per window of nearby slots (see decode_windows). Off: one call per span.
    enable_decode_windows: bool = True
    num_threads: int | None = None
    # The attention and MLP projections (and the lm head) as weight-only quantized layers,
    # re-quantized at load from the GGUF's values; CPU only. "auto": the fastest format whose
    # town decisions agree with fp32 (docs/PERFORMANCE.md), fp32 where none applies.
    weights: str = "fp32"

    def __post_init__(self) -> None:
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(
                f"weights must be one of {WEIGHT_FORMATS}, got {self.weights!r} "
                "(int8/int4: weight-only quantized linear layers on the CPU)"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.kv_cache_dtype not in _DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {_DTYPES}, got {self.kv_cache_dtype!r}"
            )
        if self.attention_backend not in _ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {_ATTENTION_BACKENDS}, "
                f"got {self.attention_backend!r}"
            )
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be ≥ 1, got {self.num_threads}")


@dataclass(slots=True)
class StructuredOutputConfig:
    """JSON schemas (structured_output): bounds checked before compiling (a dict of SchemaLimits
    fields is accepted), the compile deadline, where schemas compile, and the byte budget of
    the compiled-grammar cache."""

    schema_limits: SchemaLimits = field(default_factory=SchemaLimits)
    grammar_compile_timeout_s: float = 20.0
    # 0: compile in a thread of this process (xgrammar releases the GIL, so the engine loop
    # runs on); a caller waits at most the deadline, the compile itself then finishes unread.
    # N > 0: in up to N worker processes, killed past the deadline (each imports xgrammar and
    # torch: seconds and ~300 MB to start).
    grammar_compile_workers: int = 0
    grammar_cache_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        if isinstance(self.schema_limits, dict):
            self.schema_limits = SchemaLimits(**self.schema_limits)
        if not isinstance(self.schema_limits, SchemaLimits):
            raise ValueError("schema_limits must be a SchemaLimits or a dict of its fields")
        if not 0 < self.grammar_compile_timeout_s < float("inf"):
            raise ValueError(
                f"grammar_compile_timeout_s must be a finite number of seconds > 0, got "
                f"{self.grammar_compile_timeout_s}"
            )
        if self.grammar_compile_workers < 0:
            raise ValueError(
                f"grammar_compile_workers must be ≥ 0 (0: in this process), got "
                f"{self.grammar_compile_workers}"
            )
        if self.grammar_cache_bytes < 0:
            raise ValueError(f"grammar_cache_bytes must be ≥ 0, got {self.grammar_cache_bytes}")


_WORKER_LAUNCHES = ("spawn", "external")


@dataclass(slots=True)
class ParallelConfig:
    """One model over several processes (inference/engine/distributed/): tensor parallelism
    (attention heads and MLP columns split across ranks) and, for MoE layers, expert
    parallelism. Rank 0 is the engine itself; the others only run their shard of the model."""

    tensor_parallel_size: int = 1
    # MoE models (DeepSeek-V4): each rank holds its share of the routed experts; the attention,
    # which cannot be split by heads there, is replicated. Needs tensor_parallel_size > 1.
    enable_expert_parallel: bool = False
    # "spawn": the engine starts ranks 1..N-1 itself on this machine (torch.multiprocessing);
    # "external": they are started elsewhere (`python -m inference.engine.distributed.worker`,
    # or torchrun) and meet rank 0 at master_addr:master_port.
    worker_launch: str = "spawn"
    master_addr: str = "127.0.0.1"
    # None: a free port on this machine (spawn only).
    master_port: int | None = None
    # Every collective (and the rendezvous) fails past this instead of hanging; an idle engine
    # sends a heartbeat every quarter of it so waiting workers do not time out.
    distributed_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be ≥ 1, got {self.tensor_parallel_size}")
        if self.enable_expert_parallel and self.tensor_parallel_size < 2:
            raise ValueError(
                "enable_expert_parallel splits experts across ranks: it needs "
                f"tensor_parallel_size ≥ 2, got {self.tensor_parallel_size}"
            )
        if self.worker_launch not in _WORKER_LAUNCHES:
            raise ValueError(
                f"worker_launch must be one of {_WORKER_LAUNCHES}, got {self.worker_launch!r}"
            )
        if self.worker_launch == "external" and self.master_port is None:
            raise ValueError(
                "worker_launch='external' needs master_port: the workers on the other "
                "machines must know where to meet rank 0"
            )
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise ValueError(f"master_port must be in [1, 65535], got {self.master_port}")
        if not 0 < self.distributed_timeout_s < float("inf"):
            raise ValueError(
                f"distributed_timeout_s must be a finite number of seconds > 0, got "
                f"{self.distributed_timeout_s}"
            )


@dataclass(slots=True)
class SpeculativeConfig:
    """Speculative decoding (spec_decode): a decoding greedy request carries a draft of up to
    `num_speculative_tokens` tokens, verified in one forward with its next token; the output is
    the same tokens as without it. Sampled requests (temperature > 0) are not speculated."""

    # None: off. "ngram": prompt lookup, the tokens that followed the latest earlier occurrence
    # of the context's last n tokens (n from prompt_lookup_max down to prompt_lookup_min).
    # "mtp": the model's own multi-token-prediction layer (models that have one).
    speculative_method: str | None = None
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4

    def __post_init__(self) -> None:
        if self.speculative_method not in _SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative_method must be one of {_SPECULATIVE_METHODS}, got "
                f"{self.speculative_method!r}"
            )
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError(
                f"num_speculative_tokens must be in [1, 16] (draft tokens per step), got "
                f"{self.num_speculative_tokens}"
            )
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(
                "prompt lookup needs 1 ≤ prompt_lookup_min ≤ prompt_lookup_max (the n-gram "
                f"lengths matched), got {self.prompt_lookup_min} and {self.prompt_lookup_max}"
            )


# Sub-config field name → its class, and each flat name → the sub-config field that holds it.
_SUB_CONFIGS: dict[str, type] = {
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "runner": RunnerConfig,
    "structured_output": StructuredOutputConfig,
    "parallel": ParallelConfig,
    "speculative": SpeculativeConfig,
}
_FLAT_NAMES: dict[str, str] = {
    f.name: group for group, cls in _SUB_CONFIGS.items() for f in fields(cls)
}


@dataclass(slots=True, init=False)
class EngineConfig:
    model: str = "smollm2-135m-instruct"
    device: str = "cpu"
    seed: int = 0
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    structured_output: StructuredOutputConfig = field(default_factory=StructuredOutputConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)

    def __init__(self, **keywords: Any) -> None:
        """Keywords: the fields above (a sub-config as its dataclass or a dict of its fields),
        and any sub-config field by its flat name, which overrides that field of the sub-config
        given (copied, never changed) or of a default one."""
        unknown = sorted(set(keywords) - self.keyword_names())
        if unknown:
            raise TypeError(
                f"EngineConfig got unexpected keywords {unknown}; it takes "
                f"{sorted(self.keyword_names())}"
            )
        for f in fields(EngineConfig):
            if f.name not in _SUB_CONFIGS:
                setattr(self, f.name, keywords.get(f.name, f.default))
                continue
            sub_config = _sub_config(f.name, keywords.get(f.name))
            flat = {
                name: keywords[name]
                for name, group in _FLAT_NAMES.items()
                if group == f.name and name in keywords
            }
            setattr(self, f.name, dataclasses.replace(sub_config, **flat) if flat else sub_config)
        self.__post_init__()

    @classmethod
    def keyword_names(cls) -> frozenset[str]:
        """Every keyword the constructor takes: its fields and the sub-configs' flat names."""
        return frozenset({f.name for f in fields(cls)} | set(_FLAT_NAMES))

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be one of {known_model_names()} or a .gguf path")
        if self.device not in _DEVICES and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be one of {_DEVICES} (or 'cuda:N'), got {self.device!r}")
        if self.scheduler.max_num_batched_tokens < self.cache.block_size:
            raise ValueError(
                f"max_num_batched_tokens ({self.scheduler.max_num_batched_tokens}) must be at "
                f"least block_size ({self.cache.block_size})"
            )
        if self.speculative.num_speculative_tokens >= self.scheduler.max_num_batched_tokens:
            raise ValueError(
                f"num_speculative_tokens ({self.speculative.num_speculative_tokens}) must be "
                f"below max_num_batched_tokens ({self.scheduler.max_num_batched_tokens}): a "
                "verification step computes the draft and the token before it together"
            )
        if self.parallel.tensor_parallel_size > 1 and self.runner.weights in ("int8", "int4"):
            raise ValueError(
                f"weights={self.runner.weights!r} with tensor_parallel_size > 1: quantized layers "
                "are not sharded yet; use 'fp32' (or 'auto') with tensor parallelism"
            )
        # Refused before any worker starts (where_supported: the builder turns them off).
        tiers = self.cache.has_tiers and not self.cache.kv_tiers_where_supported
        if self.parallel.tensor_parallel_size > 1 and tiers:
            raise ValueError(
                "kv_host_cache_bytes / kv_disk_cache_dir with tensor_parallel_size > 1: the KV "
                "tiers do not read a tensor-parallel engine's KV shards yet; turn the tiers off "
                "or use one process"
            )
        if self.parallel.tensor_parallel_size > 1 and self.speculative.speculative_method == "mtp":
            raise ValueError(
                "speculative_method='mtp' with tensor_parallel_size > 1: the MTP layer is not "
                "sharded yet; use 'ngram' (drafts are verified on every rank alike) or one process"
            )
        self._resolve_dtype_and_backend()
        if self.parallel.tensor_parallel_size > 1 and self.runner.enable_cuda_graphs:
            # A captured graph would replay the collectives of one batch shape; not done yet.
            self.runner = dataclasses.replace(self.runner, enable_cuda_graphs=False)

    def _resolve_dtype_and_backend(self) -> None:
        on_cuda = self.device.startswith("cuda")
        dtype, backend = self.runner.dtype, self.runner.attention_backend
        if dtype == "auto":
            dtype = "bfloat16" if on_cuda else "float32"
        if not on_cuda and dtype != "float32":
            raise ValueError(
                f"dtype {dtype!r} needs device='cuda': this CPU path runs float32 only "
                "(half-precision matmuls are ~500× slower than float32 on these CPUs)"
            )
        if on_cuda and self.runner.weights in ("int8", "int4"):
            raise ValueError(
                f"weights={self.runner.weights!r} runs torch's CPU kernels only; use "
                "weights='fp32' or 'auto' with device='cuda'"
            )
        if backend == "auto":
            backend = "triton" if on_cuda else "torch"
        kv_dtype = self.runner.kv_cache_dtype
        kv_dtype = dtype if kv_dtype == "auto" else kv_dtype
        if on_cuda and kv_dtype != dtype:
            raise ValueError(
                f"kv_cache_dtype {kv_dtype!r} with dtype {dtype!r} on CUDA: the kernels read the "
                "model's dtype; use kv_cache_dtype='auto'"
            )
        if not on_cuda and kv_dtype not in ("float32", "bfloat16"):
            raise ValueError(
                f"kv_cache_dtype {kv_dtype!r} on the CPU: use 'float32' (exact) or 'bfloat16' "
                "(half the bytes; float16 attention is ~2x slower than bfloat16's on these CPUs)"
            )
        resolved = dataclasses.replace(
            self.runner, dtype=dtype, attention_backend=backend, kv_cache_dtype=kv_dtype
        )
        if resolved != self.runner:
            self.runner = resolved


def _sub_config(name: str, value: Any) -> Any:
    """The sub-config `name` from what was passed: None (its defaults), a dict of its fields,
    or the dataclass itself."""
    cls = _SUB_CONFIGS[name]
    if value is None:
        return cls()
    if isinstance(value, dict):
        return cls(**value)
    if not isinstance(value, cls):
        raise ValueError(f"{name} must be a {cls.__name__} or a dict of its fields, got {value!r}")
    return value


def _flat_property(group: str, name: str) -> property:
    def read(config: EngineConfig) -> Any:
        return getattr(getattr(config, group), name)

    return property(read, doc=f"config.{group}.{name}, read by its flat name.")


# Read-only flat names (config.enable_prefix_caching), for readers not moved to the sub-configs.
for _name, _group in _FLAT_NAMES.items():
    setattr(EngineConfig, _name, _flat_property(_group, _name))
