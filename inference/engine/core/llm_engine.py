"""LLMEngine: the public front. `generate` is thread-safe; one engine thread loads the model
and runs the steps (every multi-threaded torch op of the engine runs there: see
`_run_engine_thread`).

A step is three lines — schedule, execute, `scheduler.update_from_output` — as in nano-vllm and
vLLM's core. Requests from every caller thread meet in the same scheduler, so concurrent
decisions are batched together.

A caller that gives up (generate's `timeout`, a stream closed early, `abort`) has its request
finished as aborted between two steps: its KV blocks are freed and its future raises
RequestAbortedError; the other requests go on untouched.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from inference.engine.config import CacheConfig, EngineConfig
from inference.engine.core.detokenizer import IncrementalDetokenizer, stop_cut
from inference.engine.core.scheduler import Scheduler
from inference.engine.distributed.executor import TensorParallelExecutor
from inference.engine.kv.breakpoints import chat_breakpoints, check_breakpoints
from inference.engine.kv.kv_cache_manager import BoundedReplay, KVCacheManager
from inference.engine.kv.pinned_heads import PinnedHead, PinnedHeads
from inference.engine.kv.tiers.block_file import BlockLayout
from inference.engine.kv.tiers.disk_tier import DiskTier
from inference.engine.kv.tiers.group_io import GroupIO
from inference.engine.kv.tiers.host_tier import HostTier
from inference.engine.kv.tiers.offloader import KVOffloader
from inference.engine.memory_plan import check_engine
from inference.engine.metrics import EngineStats, RequestMetrics
from inference.engine.models import load_model
from inference.engine.models.deepseek_v4.loader import Shard
from inference.engine.request import Request, RequestStatus
from inference.engine.request_errors import request_failed
from inference.engine.runner.model_runner import (
    ModelRunner,
    RunnerSetup,
    group_block_bytes,
    kv_groups_of,
)
from inference.engine.sampling_params import SamplingParams
from inference.engine.spec_decode import Drafter
from inference.engine.spec_decode.mtp import MtpDrafter
from inference.engine.spec_decode.ngram import NgramProposer
from inference.engine.structured_output.structured_output import (
    CompileOutcome,
    StructuredOutputManager,
)

logger = logging.getLogger(__name__)

Prompt = str | list[int] | list[dict[str, Any]]


class RequestAbortedError(RuntimeError):
    """The request was aborted before it finished (its caller gave up: see LLMEngine.abort)."""


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    metrics: RequestMetrics


@dataclass(slots=True)
class StreamDelta:
    """What a streamed request added since the last delta; `output` is set on the last one."""

    text: str  # safe to show: no half character, no part of a stop string
    token_ids: list[int] = field(default_factory=list)
    output: RequestOutput | None = None
    request_id: str = ""  # for LLMEngine.abort


def kv_block_counts(
    cache: CacheConfig, group_bytes: dict[str, int], *, own_state: bool
) -> tuple[int, int]:
    """Blocks of the full group and of the window (sliding) group: the same count for both,
    or each its own budget (`window_cache_fraction` of the bytes, or `num_window_blocks`)."""
    separate = cache.window_cache_fraction is not None or cache.num_window_blocks is not None
    if separate and not (own_state and "sliding" in group_bytes):
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


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self._ids = itertools.count()
        self._seed_rng = torch.Generator().manual_seed(config.seed)
        self._lock = threading.Condition()
        self._inbox: list[tuple[Request, Future]] = []
        self._futures: dict[str, Future] = {}
        self._aborts: dict[str, str] = {}  # request id → why, applied by the loop between steps
        self._num_steps = 0
        self._shutdown = False
        # One model over several processes: this engine is rank 0 (distributed/executor.py).
        self.executor: TensorParallelExecutor | None = None
        if config.parallel.tensor_parallel_size > 1:
            self.executor = TensorParallelExecutor(config, self.device)
        # The engine thread loads the model, then runs the loop (see _run_engine_thread).
        started: Future[None] = Future()
        self._loop = threading.Thread(
            target=self._run_engine_thread, args=(started,), name="llm-engine-loop", daemon=True
        )
        self._loop.start()
        try:
            started.result()
        except BaseException:
            if self.executor is not None:
                self.executor.close()  # the workers leave too
            raise

    def _run_engine_thread(self, started: Future) -> None:
        """Build the engine, then run the loop: every multi-threaded torch op of the engine
        runs on this one thread. libgomp keeps a team of worker threads for each thread that
        ever ran a parallel region; once its threads outnumber the CPUs it stops spinning
        between regions and every op waits for its workers to wake. A model loaded on the
        caller's thread and stepped on this one left two teams on a 2-core CPU and made a
        decode step ~1.4x slower (docs/PERFORMANCE.md, "Decode at 4 in flight")."""
        try:
            if self.config.runner.num_threads:
                torch.set_num_threads(self.config.runner.num_threads)
            self._start(self.config)
        except BaseException as exc:
            started.set_exception(exc)
            return
        started.set_result(None)
        self._run_loop()

    def _start(self, config: EngineConfig) -> None:
        """Load the model (this rank's shard of it), size the KV cache, build the scheduler,
        the structured-output manager and the runner."""
        cache, scheduling, running = config.cache, config.scheduler, config.runner
        grammars = config.structured_output
        # Logged, and refused when it does not fit, before a byte of weights is read.
        self.memory_plan = check_engine(config)
        parallel = config.parallel
        # Under expert parallelism rank 0 reads only its share of the routed experts.
        shard = Shard(0, parallel.tensor_parallel_size) if parallel.enable_expert_parallel else None
        loaded = load_model(config.model, self.device, config.seed, running.weights, shard=shard)
        self.weights = loaded.weights  # "auto" resolved: what every request's metrics report
        if self.executor is not None:
            loaded = self.executor.shard(loaded)  # the KV cache below is this rank's shard too
        self.tokenizer = loaded.tokenizer
        self.model_config = loaded.config
        self.max_model_len = min(
            scheduling.max_model_len or loaded.max_model_len, loaded.max_model_len
        )
        own_state = hasattr(loaded.model, "allocate_state")
        self.kv_cache_dtype = running.kv_cache_dtype  # what every request's metrics report
        if own_state and self.kv_cache_dtype != running.dtype:
            logger.warning(
                "%s keeps its own attention state in the model's dtype (%s): kv_cache_dtype=%s "
                "does not apply to it",
                type(loaded.model).__name__,
                running.dtype,
                self.kv_cache_dtype,
            )
            self.kv_cache_dtype = running.dtype
        dtype = getattr(torch, self.kv_cache_dtype)
        # The sizes count fp32: a bf16 cache fits twice the blocks in the budget.
        group_bytes = {
            group: size * dtype.itemsize // 4
            for group, size in group_block_bytes(loaded.config, cache.block_size).items()
        }
        # A running request holds its window plus one prefill chunk in the sliding group (with
        # equal counts, the check of a prompt against num_blocks covers it).
        window = getattr(loaded.config, "sliding_window", None) or 0
        min_window = -(-(window + scheduling.max_num_batched_tokens) // cache.block_size) + 1
        self.num_blocks, self.num_window_blocks = kv_block_counts(
            cache, group_bytes, own_state=own_state
        )
        if self.num_window_blocks != self.num_blocks and self.num_window_blocks < min_window:
            raise ValueError(
                f"the window group has {self.num_window_blocks} blocks; one request's window "
                f"({window} tokens) plus a prefill chunk ({scheduling.max_num_batched_tokens}) "
                f"needs {min_window}: raise its budget or lower max_num_batched_tokens"
            )
        self.kv_cache_manager = KVCacheManager(
            self.num_blocks,
            cache.block_size,
            cache.enable_prefix_caching,
            loaded.fingerprint,
            sliding_window=self._sliding_window(loaded.config),
            num_sliding_blocks=self.num_window_blocks,
            retention_interval=cache.retention_interval,
            exact_reuse=cache.enable_partial_block_reuse,
            junction_checkpoints=cache.enable_junction_checkpoints,
            bounded_replay=self._bounded_replay(loaded.config),
        )
        self.pinned = PinnedHeads(self.kv_cache_manager, cache.max_pinned_fraction)
        # Bytes one sliding-group block holds across the sliding layers (checkpoint memory).
        self.sliding_block_bytes = group_bytes.get("sliding", 0)
        self.scheduler = Scheduler(
            self.kv_cache_manager,
            scheduling.max_num_seqs,
            scheduling.max_num_batched_tokens,
            # A full-attention model already shares a head computed in the same step (blocks are
            # registered when allocated and each layer writes before it reads); holding requests
            # back would only add a step. A sliding-window model needs the checkpoint.
            enable_shared_prefill=scheduling.enable_shared_prefill
            and cache.enable_prefix_caching
            and self.kv_cache_manager.sliding is not None,
            tokenizer=self.tokenizer,
            max_model_len=self.max_model_len,
            enable_jump_forward=scheduling.enable_jump_forward,
            drafter=self._drafter(loaded.model),
            num_speculative_tokens=config.speculative.num_speculative_tokens,
            prefill_chunk_while_decoding=scheduling.prefill_chunk_while_decoding,
        )
        self.structured = StructuredOutputManager(
            self.tokenizer,
            loaded.config.vocab_size,
            limits=grammars.schema_limits,
            compile_timeout_s=grammars.grammar_compile_timeout_s,
            max_compile_workers=grammars.grammar_compile_workers,
            cache_bytes=grammars.grammar_cache_bytes,
        )
        setup = RunnerSetup(
            num_blocks=self.num_blocks,
            block_size=cache.block_size,
            num_window_blocks=self.num_window_blocks,
            dtype=running.dtype,
            kv_cache_dtype=self.kv_cache_dtype,
            use_kernels=running.attention_backend == "triton",
            cuda_graph_max_len=self.max_model_len if running.enable_cuda_graphs else None,
            max_num_seqs=scheduling.max_num_seqs,
            decode_windows=running.enable_decode_windows,
            draft_with_mtp=config.speculative.speculative_method == "mtp",
        )
        runner = setup.build(loaded, self.device, self.structured)
        if self.executor is not None:
            self.executor.attach(runner, setup)
        self.runner: ModelRunner | TensorParallelExecutor = self.executor or runner
        self.offloader = self._kv_offloader(loaded.fingerprint, dtype) if cache.has_tiers else None

    # ---- the public front -------------------------------------------------------------

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        params: SamplingParams | None = None,
        *,
        timeout: float | None = None,
        priority: int = 0,
    ) -> list[RequestOutput]:
        """Run prompts to completion (blocking); safe to call from many threads at once.
        Past `timeout` seconds (counted once the requests are built and queued) the requests
        still running are aborted and TimeoutError is raised. `priority`: the scheduling
        class, lower first (vLLM's priority policy; see Scheduler.schedule)."""
        params = params or SamplingParams()
        batch = [prompts] if _is_single_prompt(prompts) else list(prompts)
        requests = [self._make_request(prompt, params, priority) for prompt in batch]
        futures = self._submit(requests)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            return [future.result(_left(deadline)) for future in futures]
        except TimeoutError:
            self._abort_all(requests, f"not finished within {timeout:g} s")
            raise TimeoutError(
                f"the completion did not finish within {timeout:g} s; it was aborted and its "
                "KV blocks freed"
            ) from None
        except BaseException:  # the caller's thread is interrupted: nobody will read these
            self._abort_all(requests, "its caller stopped waiting")
            raise

    def generate_stream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        timeout: float | None = None,
        priority: int = 0,
    ) -> Iterator[StreamDelta]:
        """Run one prompt, yielding its text as tokens are sampled (blocking, in the caller's
        thread; thread-safe like `generate`). The deltas add up to the final text, which the
        last delta's `output` carries. The request is batched with everything else in flight.
        Closing the generator early (or an exception in the consumer's loop, once the generator
        is closed) aborts the request; past `timeout` seconds it is aborted and TimeoutError
        is raised. `priority` as in `generate`."""
        params = params or SamplingParams()
        request = self._make_request(prompt, params, priority)
        sampled: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        request.on_token = sampled.put
        (future,) = self._submit([request])
        # Runs after the last on_token on the loop thread (or at once if already done).
        future.add_done_callback(lambda _: sampled.put(None))
        # A checkpoint without a tokenizer streams token ids with empty text.
        detokenizer = (
            IncrementalDetokenizer(self.tokenizer, params.stop_list) if self.tokenizer else None
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while (token := _next_token(sampled, deadline, timeout)) is not None:
                token_ids = [token]
                while not sampled.empty():  # take what piled up, decode once
                    if (more := sampled.get()) is None:
                        sampled.put(None)
                        break
                    token_ids.append(more)
                text = detokenizer.add(token_ids) if detokenizer else ""
                if text or detokenizer is None:
                    yield StreamDelta(text, token_ids, request_id=request.request_id)
            output = future.result()  # raises what failed the request
            text = detokenizer.finish(output.text) if detokenizer else ""
            yield StreamDelta(text, output=output, request_id=request.request_id)
        finally:
            if not future.done():  # closed early, timed out, or the consumer failed
                self.abort(request.request_id, "its stream was closed before the end")

    def _submit(self, requests: list[Request]) -> list[Future]:
        futures = [Future() for _ in requests]
        with self._lock:
            if self._shutdown:
                raise RuntimeError("engine is shut down")
            self._inbox.extend(zip(requests, futures, strict=True))
            self._lock.notify()
        return futures

    def abort(self, request_id: str, reason: str = "aborted by its caller") -> None:
        """Finish a request as aborted before the next step: its KV blocks are freed and its
        future raises RequestAbortedError. Thread-safe; a finished or unknown id is ignored."""
        with self._lock:
            self._aborts[request_id] = reason
            self._lock.notify()

    def _abort_all(self, requests: list[Request], reason: str) -> None:
        for request in requests:
            self.abort(request.request_id, reason)

    def _apply_aborts(self) -> None:
        """(loop thread, lock held, between steps) Finish the requests `abort` was asked for."""
        if not self._aborts:
            return
        aborts, self._aborts = self._aborts, {}
        for request in self.scheduler.finish_requests(aborts, RequestStatus.FINISHED_ABORTED):
            request.error = RequestAbortedError(
                f"request {request.request_id} was aborted ({aborts[request.request_id]}); "
                "its KV blocks are freed"
            )
            self._deliver(request, self._futures.pop(request.request_id))

    def stats(self) -> EngineStats:
        """A snapshot assembled from the components' own (scheduler, KV cache, pinned heads)."""
        with self._lock:
            scheduler = self.scheduler.make_stats()
            cache = self.kv_cache_manager.make_stats()
            return EngineStats(
                prefix_cache_queries=cache.prefix_cache_queries,
                prefix_cache_hits=cache.prefix_cache_hits,
                kv_cache_usage=cache.usage,
                num_running=scheduler.num_running,
                num_waiting=scheduler.num_waiting + len(self._inbox),
                num_preemptions=scheduler.num_preemptions,
                num_steps=self._num_steps,
                num_forced_tokens=scheduler.num_forced_tokens,
                num_lost_to_retention=cache.num_lost_to_retention,
                num_lost_to_alignment=cache.num_lost_to_alignment,
                num_lost_to_eviction=cache.num_lost_to_eviction,
                num_cold_tokens=cache.num_cold_tokens,
                num_checkpoints=cache.num_checkpoints,
                num_checkpoint_blocks=cache.num_checkpoint_blocks,
                checkpoint_memory_bytes=cache.num_checkpoint_blocks * self.sliding_block_bytes,
                num_prefill_tokens=scheduler.num_prefill_tokens,
                reuse_sources=scheduler.reuse_sources,
                num_junction_checkpoints=cache.num_junction_checkpoints,
                num_partial_block_copies=cache.num_partial_block_copies,
                num_pinned_blocks=self.pinned.num_pinned_blocks(),
                kv_tiers=self.offloader.make_stats() if self.offloader is not None else {},
                num_spec_verifications=scheduler.num_spec_verifications,
                num_draft_tokens=scheduler.num_draft_tokens,
                num_accepted_tokens=scheduler.num_accepted_tokens,
                weights=self.weights,
                kv_cache_dtype=self.kv_cache_dtype,
            )

    @property
    def failure(self) -> Exception | None:
        """Why this engine can no longer run steps (a rank of a tensor-parallel engine is gone),
        or None. Its requests fail with this; shut it down and start a new engine."""
        return self.executor.failure if self.executor is not None else None

    @property
    def has_sliding_window_layers(self) -> bool:
        """Whether some layers attend over a window (then the retention interval matters)."""
        return "sliding" in kv_groups_of(self.model_config)

    def warm(
        self, prompt_head: Prompt, pin: bool = True, cache_salt: str | None = None
    ) -> PinnedHead:
        """Compute a prompt head (text, token ids, or chat messages: rendered without a
        generation prompt) so later prompts starting with it resume at its very end; with
        `pin`, keep it cached until `unpin(handle)`. Thread-safe like generate."""
        if not self.config.cache.enable_prefix_caching:
            raise ValueError("warm() needs enable_prefix_caching=True: nothing would be kept")
        token_ids = self._tokenize(prompt_head, add_generation_prompt=False)
        if pin:
            with self._lock:
                self.pinned.check_room(len(token_ids))
        # One token: the head's unfilled last block is cached as a partial tail when it ends.
        params = SamplingParams(
            max_tokens=1,
            temperature=0.0,
            ignore_eos=True,
            cache_salt=cache_salt,
            cache_breakpoints=[len(token_ids)],
        )
        self.generate([token_ids], params)
        with self._lock:
            if not pin:
                return PinnedHead(0, len(token_ids), len(token_ids), "")
            return self.pinned.pin(token_ids, cache_salt)

    def compile_schemas(self, schemas: list[str | dict]) -> list[str | None]:
        """Compile JSON schemas into the engine's grammar cache now, on its compile threads (at
        most `grammar_compile_workers`, ≥ 1, at once), and wait for them, so requests using
        them later find them compiled; per schema, None or why it was refused (over the limits,
        invalid, past the compile deadline: later requests with it are refused the same way).
        Thread-safe."""
        futures = [self.compile_schema_async(schema)[0] for schema in schemas]
        return [future.result().error for future in futures]

    def compile_schema_async(self, schema: str | dict) -> tuple[Future[CompileOutcome], bool]:
        """Start compiling a JSON schema on the engine's compile threads and return at once: a
        future of its CompileOutcome (the compile's seconds, why it was refused), and whether
        this call started a compile. A request with the schema, sent once the future is done,
        finds it compiled; a caller that serves other requests need never wait on a compile
        (StructuredOutputManager.compile_async). Thread-safe."""
        return self.structured.compile_async(_schema_text(schema))

    def is_schema_known(self, schema: str | dict) -> bool:
        """Whether the schema is compiled (or refused) already, or being compiled."""
        return self.structured.is_known(_schema_text(schema))

    def unpin(self, handle: PinnedHead | int) -> None:
        """Let a warmed head's blocks be evicted again (ValueError for an unknown handle)."""
        with self._lock:
            self.pinned.unpin(handle)

    def shutdown(self) -> None:
        with self._lock:
            self._shutdown = True
            self._lock.notify()
        self._loop.join(timeout=30)
        if self.offloader is not None:
            self.offloader.close()
        self.runner.close()
        self.structured.close()

    def flush_kv_tiers(self, timeout: float | None = 60.0) -> bool:
        """Wait until every block computed so far is written to the KV tiers (False on
        timeout; True at once without tiers)."""
        return self.offloader.flush(timeout) if self.offloader is not None else True

    def _kv_tiers_unsupported(self) -> str | None:
        """Why the KV tiers cannot store this engine's KV, or None when they can."""
        if self.executor is not None:
            return (
                "the KV tiers do not read a tensor-parallel engine's KV shards yet; use them "
                "with tensor_parallel_size=1"
            )
        if self.runner.state is not None:
            return (
                f"model {self.config.model} keeps its own compressed state (DeepSeek-V4), which "
                "the KV tiers do not store yet; use them with llama-family or Gemma 3 models"
            )
        return None

    def _kv_offloader(self, fingerprint: str, dtype: torch.dtype) -> KVOffloader | None:
        """The tiers below the device pool (kv/tiers), for every KV cache group."""
        cache = self.config.cache
        unsupported = self._kv_tiers_unsupported()
        if unsupported and cache.kv_tiers_where_supported:
            logger.info("KV tiers off for this engine: %s", unsupported)
            return None
        if unsupported:
            raise ValueError(f"kv_host_cache_bytes / kv_disk_cache_dir: {unsupported}")

        def group(name: str) -> GroupIO:
            shape = self.runner.block_shape(name)
            layout = BlockLayout(fingerprint, name, cache.block_size, shape, str(dtype)[6:])
            manager = self.kv_cache_manager.coordinator.full
            if name == "sliding":
                manager = self.kv_cache_manager.sliding
            return GroupIO(
                layout,
                manager,
                lambda block_ids: self.runner.read_blocks(name, block_ids),
                lambda block_ids, payload: self.runner.write_blocks(name, block_ids, payload),
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
        sliding = group("sliding") if self.kv_cache_manager.sliding is not None else None
        return KVOffloader(
            group("full"),
            sliding,
            host=host,
            disk=disk,
            load_timeout_s=cache.kv_disk_load_timeout_s,
        )

    def _drafter(self, model) -> Drafter | None:
        speculative = self.config.speculative
        if speculative.speculative_method is None:
            return None
        if speculative.speculative_method == "mtp":
            if not getattr(model, "has_mtp", False):
                raise ValueError(
                    "speculative_method='mtp' needs a model with a multi-token-prediction "
                    f"layer; model {self.config.model} has none (DeepSeek-V4 checkpoints with "
                    "num_nextn_predict_layers ≥ 1 do): use 'ngram'"
                )
            return MtpDrafter()
        return NgramProposer(speculative.prompt_lookup_min, speculative.prompt_lookup_max)

    def _bounded_replay(self, model_config) -> BoundedReplay | None:
        if not self.config.cache.enable_bounded_replay:
            return None
        alignment = getattr(model_config, "replay_alignment", None)
        if alignment is None:
            raise ValueError(
                f"enable_bounded_replay is DeepSeek's scheme for DeepSeek-V4; model "
                f"{self.config.model} has no compressed state to replay over"
            )
        return BoundedReplay(int(model_config.sliding_window), int(alignment))

    def _sliding_window(self, model_config) -> int | None:
        """The window of the model's sliding layers (None: it has none, the retention interval
        changes nothing and we say so)."""
        groups = kv_groups_of(model_config)
        if "sliding" not in groups:
            if self.config.cache.retention_interval is not None:
                logger.warning(
                    "retention_interval=%s changes nothing: model %s has no sliding-window "
                    "layers (every layer keeps all its KV, so every cached block is reusable)",
                    self.config.cache.retention_interval,
                    self.config.model,
                )
            return None
        if "full" not in groups:
            raise ValueError(
                f"model {self.config.model} has only sliding-window layers; the engine needs "
                "at least one full-attention layer to chain its prefix cache"
            )
        return int(model_config.sliding_window)

    # ---- building requests (caller's thread) --------------------------------------------

    def _make_request(self, prompt: Prompt, params: SamplingParams, priority: int = 0) -> Request:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority must be an int (lower is served first), not {priority!r}")
        token_ids = self._tokenize(prompt)
        if self.tokenizer is None and params.stop_list:
            raise ValueError(self._no_tokenizer("stop strings"))
        if not token_ids:
            raise ValueError("prompt is empty")
        breakpoints = check_breakpoints(params.cache_breakpoints, len(token_ids))
        is_chat = isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)
        if is_chat and self.config.cache.enable_chat_breakpoints:
            marked = chat_breakpoints(self.tokenizer, prompt, token_ids)
            breakpoints = sorted({*breakpoints, *marked})
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens; the model's context is {self.max_model_len} "
                "(prompt plus at least one output token): shorten the prompt"
            )
        vocab = self.structured.vocab_size
        if any(not 0 <= t < vocab for t in token_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        max_len = min(len(token_ids) + params.max_tokens, self.max_model_len)
        needed_blocks = -(-max_len // self.config.cache.block_size)
        if needed_blocks > self.num_blocks:
            raise ValueError(
                f"prompt plus max_tokens needs {needed_blocks} KV blocks but the cache holds "
                f"{self.num_blocks}: raise kv_cache_memory_bytes or lower max_tokens"
            )
        schema = params.json_schema_text()
        compile_started = time.perf_counter()
        grammar = self.structured.grammar_for(schema) if schema is not None else None
        grammar_compile_s = time.perf_counter() - compile_started if grammar is not None else 0.0
        seed = params.seed
        if seed is None and not params.is_greedy:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_rng))
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        return Request(
            request_id=str(next(self._ids)),
            prompt_token_ids=token_ids,
            sampling_params=params,
            grammar=grammar,
            generator=generator,
            cache_breakpoints=breakpoints,
            grammar_compile_s=grammar_compile_s,
            priority=priority,
        )

    def _no_tokenizer(self, what: str) -> str:
        return (
            f"{self.config.model} has no tokenizer (no tokenizer.json in its directory): "
            f"{what} need one; give prompts as token ids, or add the model's tokenizer.json "
            "and tokenizer_config.json"
        )

    def _tokenize(self, prompt: Prompt, add_generation_prompt: bool = True) -> list[int]:
        if self.tokenizer is None and not (
            isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
        ):
            raise ValueError(self._no_tokenizer("text and chat prompts"))
        if isinstance(prompt, str):
            # With the BOS the model's GGUF asks for (Gemma: yes; SmolLM2: no), as transformers.
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
            return self.tokenizer.apply_chat_template(prompt, add_generation_prompt)
        raise ValueError(
            "a prompt must be a string, a list of token ids, or a list of chat messages "
            '[{"role": ..., "content": ...}]'
        )

    # ---- the loop (engine thread) -------------------------------------------------------

    def _run_loop(self) -> None:
        while True:
            with self._lock:
                while (
                    not self._shutdown and not self._inbox and not self.scheduler.has_unfinished()
                ):
                    self._lock.wait()
                if self._shutdown:
                    self._fail_all(RuntimeError("engine shut down"))
                    return
                for request, future in self._inbox:
                    self._futures[request.request_id] = future
                    self.scheduler.add_request(request)
                self._inbox.clear()
                self._apply_aborts()
            try:
                finished = self.step()
            except Exception as exc:  # a bug must not hang every caller
                logger.exception("engine step failed; failing the requests in flight")
                with self._lock:
                    self._fail_all(exc)
                continue
            for request in finished:
                self._deliver(request, self._futures.pop(request.request_id))

    def _deliver(self, request: Request, future: Future) -> None:
        """A finished request's output to its caller, or the error that failed it alone."""
        if request.error is None:
            try:
                future.set_result(self._output(request))
                return
            except Exception as exc:  # detokenizing this request's tokens
                request.error = request_failed(request.request_id, exc)
        future.set_exception(request.error)

    def step(self) -> list[Request]:
        """One engine step: schedule, execute, update from its output. Returns the requests
        that finished."""
        offloader = self.offloader
        with self._lock:
            if offloader is not None:
                offloader.prepare(self.scheduler.waiting)
            scheduler_output = self.scheduler.schedule()
        if scheduler_output.is_empty:
            if offloader is not None and offloader.is_loading:
                offloader.wait_for_loads(timeout=0.05)  # only requests waiting for their blocks
            return []
        try:
            sampled = self.runner.execute(scheduler_output)
            drafts = self.runner.take_drafts()
        except Exception as exc:  # the model itself: no one request to blame
            logger.exception("engine step failed; failing the requests it ran")
            with self._lock:
                return self.scheduler.fail_step(scheduler_output, exc)
        with self._lock:
            self._num_steps += 1
            if offloader is not None:  # before finished requests free their blocks
                offloader.offload(scheduler_output)
            return self.scheduler.update_from_output(scheduler_output, sampled, drafts)

    def _output(self, request: Request) -> RequestOutput:
        decoded = self.tokenizer.decode(request.output_token_ids) if self.tokenizer else ""
        text, _ = stop_cut(decoded, request.sampling_params.stop_list)
        return RequestOutput(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=list(request.output_token_ids),
            text=text,
            finish_reason=request.status.value,
            metrics=request.metrics(self.weights, self.kv_cache_dtype),
        )

    def _fail_all(self, exc: BaseException) -> None:
        for request in [*self.scheduler.running, *self.scheduler.waiting]:
            self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
        for future in self._futures.values():
            future.set_exception(exc)
        self._futures.clear()
        for _, future in self._inbox:
            future.set_exception(exc)
        self._inbox.clear()


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def _next_token(
    sampled: queue.SimpleQueue[int | None], deadline: float | None, timeout: float | None
) -> int | None:
    try:
        return sampled.get(timeout=_left(deadline))
    except queue.Empty:
        raise TimeoutError(
            f"the completion did not finish within {timeout:g} s; it was aborted and its KV "
            "blocks freed"
        ) from None


def _schema_text(schema: str | dict) -> str:
    """The text a request's SamplingParams gives the grammar cache, so both find one entry."""
    return SamplingParams(json_schema=schema).json_schema_text()


def _is_single_prompt(prompts: Any) -> bool:
    if isinstance(prompts, str):
        return True
    return isinstance(prompts, list) and bool(prompts) and isinstance(prompts[0], (int, dict))
