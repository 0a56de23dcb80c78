"""EngineConfig: every engine knob in one validated dataclass.

Django settings become an EngineConfig in one place (inference/runtime.py); nothing in the
engine reads the environment or settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inference.engine.model_files import known_model_names
from inference.engine.retention import check_retention_interval
from inference.engine.schema_limits import SchemaLimits

_DEVICES = ("cpu", "cuda")
_DTYPES = ("auto", "float32", "bfloat16", "float16")
_ATTENTION_BACKENDS = ("auto", "torch", "triton")


@dataclass(slots=True)
class EngineConfig:
    model: str = "smollm2-135m-instruct"
    device: str = "cpu"
    enable_prefix_caching: bool = True
    block_size: int = 16
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
    # One prefill per shared head: requests waiting together on the same uncached head wait
    # for the first of them to compute it (see shared_prefill). Off: each prefills its own.
    enable_shared_prefill: bool = True
    # LLMEngine.warm(pin=True): the share of the KV blocks pinned heads may hold.
    max_pinned_fraction: float = 0.5
    # KV memory: an explicit block count wins over the byte budget. A sliding-window model's two
    # KV groups get the same number of blocks (the budget is split by layer count).
    kv_cache_memory_bytes: int = 1 << 30
    num_kv_blocks: int | None = None
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 1024
    # Shorter than the model's own context is allowed; longer is an error at load time.
    max_model_len: int | None = None
    num_threads: int | None = None
    seed: int = 0
    # Weights and KV cache. "auto": float32 on CPU (no fast bf16 there), bfloat16 on CUDA.
    dtype: str = "auto"
    # "auto": the triton kernels on CUDA, the torch path on CPU. "triton" on CPU runs the kernels
    # under triton's interpreter (TRITON_INTERPRET=1 before triton is imported): for tests.
    attention_backend: str = "auto"
    # Decode steps replayed from CUDA graphs (batch sizes 1, 2, 4, ... 64); CUDA + triton only.
    enable_cuda_graphs: bool = True
    # JSON-schema output: append the tokens the grammar forces without a model step of their own.
    enable_jump_forward: bool = True
    # Torch path: all decoding sequences of a step read their contexts together, one masked
    # attention call per window of nearby slots (see decode_windows). Off: one call per span.
    enable_decode_windows: bool = True
    # JSON schemas (structured_output): bounds checked before compiling (a dict of SchemaLimits
    # fields is accepted), the compile deadline, how many schemas compile at once (each in its
    # own worker process), and the byte budget of the compiled-grammar cache.
    schema_limits: SchemaLimits = field(default_factory=SchemaLimits)
    grammar_compile_timeout_s: float = 20.0
    # 0: compile in a thread of this process (xgrammar releases the GIL, so the engine loop
    # runs on); a caller waits at most the deadline, the compile itself then finishes unread.
    # N > 0: in up to N worker processes, killed past the deadline (each imports xgrammar and
    # torch: seconds and ~300 MB to start).
    grammar_compile_workers: int = 0
    grammar_cache_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be one of {known_model_names()} or a .gguf path")
        if self.device not in _DEVICES and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be one of {_DEVICES} (or 'cuda:N'), got {self.device!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two ≥ 1, got {self.block_size}")
        check_retention_interval(self.retention_interval, self.block_size)
        if not 0 <= self.max_pinned_fraction < 1:
            raise ValueError(
                f"max_pinned_fraction must be in [0, 1) (a share of the KV blocks), got "
                f"{self.max_pinned_fraction}"
            )
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks must be ≥ 2, got {self.num_kv_blocks}")
        if self.num_kv_blocks is None and self.kv_cache_memory_bytes < 1 << 20:
            raise ValueError(
                f"kv_cache_memory_bytes must be at least 1 MiB, got {self.kv_cache_memory_bytes}"
            )
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be ≥ 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.block_size:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"block_size ({self.block_size})"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be ≥ 2, got {self.max_model_len}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be ≥ 1, got {self.num_threads}")
        self._check_grammar_fields()
        self._resolve_dtype_and_backend()

    def _check_grammar_fields(self) -> None:
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

    def _resolve_dtype_and_backend(self) -> None:
        on_cuda = self.device.startswith("cuda")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.dtype == "auto":
            self.dtype = "bfloat16" if on_cuda else "float32"
        if not on_cuda and self.dtype != "float32":
            raise ValueError(
                f"dtype {self.dtype!r} needs device='cuda': this CPU path runs float32 only "
                "(half-precision matmuls are ~500× slower than float32 on these CPUs)"
            )
        if self.attention_backend not in _ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {_ATTENTION_BACKENDS}, "
                f"got {self.attention_backend!r}"
            )
        if self.attention_backend == "auto":
            self.attention_backend = "triton" if on_cuda else "torch"
