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

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Future

import torch

from inference.engine.config import EngineConfig
from inference.engine.core.engine_builder import build_engine
from inference.engine.core.engine_stats import make_engine_stats
from inference.engine.core.input_processor import InputProcessor, Prompt, is_single_prompt
from inference.engine.core.output_processor import Deadline, OutputProcessor
from inference.engine.distributed.executor import TensorParallelExecutor
from inference.engine.kv.pinned_heads import PinnedHead
from inference.engine.metrics import EngineStats
from inference.engine.outputs import RequestAbortedError, RequestOutput, StreamDelta
from inference.engine.request import Request, RequestStatus
from inference.engine.request_errors import EngineShutDown
from inference.engine.sampling_params import SamplingParams
from inference.engine.structured_output.structured_output import CompileOutcome

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device)
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
        """Build every component (core/engine_builder.py); name what callers, the front and
        the loop reach (stats read `parts` whole)."""
        self.parts = parts = build_engine(config, self.device, self.executor)
        self.memory_plan = parts.memory_plan
        self.weights = parts.weights
        self.kv_cache_dtype = parts.kv_cache_dtype
        self.tokenizer = parts.tokenizer
        self.max_model_len = parts.max_model_len
        self.num_blocks = parts.num_blocks
        self.num_window_blocks = parts.num_window_blocks
        self.kv_cache_manager = parts.kv_cache_manager
        self.pinned = parts.pinned
        self.scheduler = parts.scheduler
        self.structured = parts.structured
        self.runner = parts.runner
        self.offloader = parts.offloader
        self.processor = InputProcessor(
            config,
            self.tokenizer,
            self.structured,
            max_model_len=self.max_model_len,
            num_blocks=self.num_blocks,
        )
        self.output_processor = OutputProcessor(self.tokenizer, self.weights, self.kv_cache_dtype)

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
        batch = [prompts] if is_single_prompt(prompts) else list(prompts)
        requests = [self.processor.make_request(prompt, params, priority) for prompt in batch]
        futures = self._submit(requests)
        deadline = Deadline(timeout)
        try:
            return [future.result(deadline.left()) for future in futures]
        except TimeoutError:
            self._abort_all(requests, f"not finished within {timeout:g} s")
            raise deadline.error() from None
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
        request = self.processor.make_request(prompt, params, priority)
        stream = self.output_processor.open_stream(request)
        (future,) = self._submit([request])
        try:
            yield from stream.deltas(future, Deadline(timeout))
        finally:
            if not future.done():  # closed early, timed out, or the consumer failed
                self.abort(request.request_id, "its stream was closed before the end")

    def _submit(self, requests: list[Request]) -> list[Future]:
        futures = [Future() for _ in requests]
        with self._lock:
            if self._shutdown:
                raise EngineShutDown()
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
            self.output_processor.deliver(request, self._futures.pop(request.request_id))

    def stats(self) -> EngineStats:
        """A snapshot assembled from the components' own (scheduler, KV cache, pinned heads)."""
        with self._lock:
            return make_engine_stats(
                self.parts, num_queued=len(self._inbox), num_steps=self._num_steps
            )

    @property
    def failure(self) -> Exception | None:
        """Why this engine can no longer run steps (a rank of a tensor-parallel engine is gone),
        or None. Its requests fail with this; shut it down and start a new engine."""
        return self.executor.failure if self.executor is not None else None

    @property
    def has_sliding_window_layers(self) -> bool:
        """Whether some layers attend over a window (then the retention interval matters)."""
        return "sliding" in self.parts.model_config.paged_state_spec().kv_groups

    def warm(
        self, prompt_head: Prompt, pin: bool = True, cache_salt: str | None = None
    ) -> PinnedHead:
        """Compute a prompt head (text, token ids, or chat messages: rendered without a
        generation prompt) so later prompts starting with it resume at its very end; with
        `pin`, keep it cached until `unpin(handle)`. Thread-safe like generate."""
        if not self.config.cache.enable_prefix_caching:
            raise ValueError("warm() needs enable_prefix_caching=True: nothing would be kept")
        token_ids = self.processor.tokenize(prompt_head, add_generation_prompt=False)
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

    # ---- the loop (engine thread) -------------------------------------------------------

    def _run_loop(self) -> None:
        while True:
            with self._lock:
                while (
                    not self._shutdown and not self._inbox and not self.scheduler.has_unfinished()
                ):
                    self._lock.wait()
                if self._shutdown:
                    self._fail_all(EngineShutDown())
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
                self.output_processor.deliver(request, self._futures.pop(request.request_id))

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

    def _fail_all(self, exc: BaseException) -> None:
        for request in [*self.scheduler.running, *self.scheduler.waiting]:
            self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
        for future in self._futures.values():
            future.set_exception(exc)
        self._futures.clear()
        for _, future in self._inbox:
            future.set_exception(exc)
        self._inbox.clear()


def _schema_text(schema: str | dict) -> str:
    """The text a request's SamplingParams gives the grammar cache, so both find one entry."""
    return SamplingParams(json_schema=schema).json_schema_text()
