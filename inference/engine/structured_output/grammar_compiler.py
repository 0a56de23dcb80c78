"""Compiling JSON schemas into grammars: off the engine's lock, once per schema, with a deadline.

- `GrammarCache` (what StructuredOutputManager uses): an engine's way to its compiled grammars.
  The first caller of a schema starts its compile, in its own thread (`get`) or on threads it
  names (`start`: a caller that must not wait gets a future); callers of the same schema
  meanwhile get that compile's future, callers of other schemas do not wait at all (no lock is
  held while compiling). A schema that failed (invalid, or past the deadline) is remembered
  too, so asking again is refused at once.
- `CompiledGrammars`: what the compiles made, by the schema's SHA-256, least recently used
  evicted past a byte budget; one per tokenizer (and deadline and budget) in this process
  (`shared_grammars`), so an engine built after another of the same model (the experiment's
  steps, one engine each) finds the schemas compiled: a town schema on Gemma's 262k vocabulary
  costs seconds of CPU.
- `CompilePool`: the compiles run in child processes (grammar_worker.py), because a C++
  compile cannot be interrupted in-process: one past its deadline is killed with its process.
  Idle workers are kept and reused (starting one imports xgrammar and torch: seconds); a
  compile takes an idle worker or starts one, up to `max_workers` at once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from pathlib import Path

import xgrammar as xgr

from inference.engine.request_errors import EngineShutDown

logger = logging.getLogger(__name__)

_WORKER_SCRIPT = Path(__file__).with_name("grammar_worker.py")
STARTUP_TIMEOUT_S = 120.0  # importing torch on a busy 2-core machine takes seconds, not minutes
COMPILE_POLL_S = 0.1  # how often a waiting caller reads the compile thread's CPU clock
WALL_DEADLINE_FACTOR = 10.0  # a caller waits at most this many deadlines by the clock


class CompileDeadlineError(ValueError):
    """A schema whose compile ran past the deadline (its worker was killed)."""


class CompileWorker:
    """One child process that compiles schemas one at a time."""

    def __init__(self, tokenizer_info_json: bytes) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # -P: the script's folder (this package) is not put on sys.path; only xgrammar loads.
        self._process = subprocess.Popen(
            [sys.executable, "-P", str(_WORKER_SCRIPT)],
            stdin=to_child_r,
            stdout=from_child_w,
            close_fds=True,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._requests = Connection(to_child_w, readable=False)
        self._replies = Connection(from_child_r, writable=False)
        self._requests.send_bytes(tokenizer_info_json)
        self._is_ready = False

    @property
    def pid(self) -> int:
        return self._process.pid

    def compile(self, schema_text: str, timeout_s: float) -> str:
        """The compiled grammar as xgrammar's JSON. ValueError when xgrammar refuses the schema
        or the compile runs past `timeout_s` (the worker is then killed: do not reuse it)."""
        self.wait_ready()
        self._requests.send_bytes(schema_text.encode("utf-8", "surrogatepass"))
        if not self._replies.poll(timeout_s):
            self.kill()
            raise CompileDeadlineError(
                f"json_schema did not compile within the {timeout_s:g} s deadline "
                "(grammar_compile_timeout_s); the compile was stopped: simplify the schema"
            )
        reply = self._recv()
        if reply[:2] == b"er":
            raise ValueError(f"invalid json_schema: {reply[2:].decode('utf-8', 'replace')}")
        return reply[2:].decode()

    def wait_ready(self) -> None:
        """Block until the worker has loaded xgrammar (once; RuntimeError if it never does)."""
        if self._is_ready:
            return
        if not self._replies.poll(STARTUP_TIMEOUT_S):
            self.kill()
            raise RuntimeError(
                f"the grammar compile worker did not start within {STARTUP_TIMEOUT_S:g} s"
            )
        assert self._recv() == b"ready"
        self._is_ready = True

    def _recv(self) -> bytes:
        try:
            return self._replies.recv_bytes()
        except EOFError:
            code = self._process.wait()
            raise RuntimeError(f"the grammar compile worker died (exit code {code})") from None

    def kill(self) -> None:
        self._process.kill()
        self._process.wait()
        self.close()

    def close(self) -> None:
        """Close its pipes; an idle worker then exits by itself."""
        self._requests.close()
        self._replies.close()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


class CompilePool:
    """Compile workers handed out one per compile; at most `max_workers` exist at once."""

    def __init__(self, tokenizer_info_json: bytes, max_workers: int, timeout_s: float) -> None:
        self._tokenizer_info_json = tokenizer_info_json
        self.max_workers = max_workers
        self.timeout_s = timeout_s
        self._idle: list[CompileWorker] = []
        self._num_workers = 0
        self._closed = False
        self._lock = threading.Condition()

    def compile(self, schema_text: str) -> str:
        """The compiled grammar as xgrammar's JSON (see CompileWorker.compile)."""
        worker = self._take()
        try:
            result = worker.compile(schema_text, self.timeout_s)
        except CompileDeadlineError:
            self._give_back(None)  # killed
            raise
        except ValueError:
            self._give_back(worker)  # xgrammar refused the schema: the worker is fine
            raise
        except BaseException:
            worker.kill()
            self._give_back(None)
            raise
        self._give_back(worker)
        return result

    def start(self, num_workers: int) -> None:
        """Start workers until `num_workers` exist (at most max_workers) and wait until they are
        ready, so the next compiles do not wait for a worker to load."""
        started = []
        while len(started) < num_workers and self._num_workers < self.max_workers:
            started.append(self._take())
        for worker in started:
            worker.wait_ready()
        for worker in started:
            self._give_back(worker)

    def _take(self) -> CompileWorker:
        deadline = time.monotonic() + self.timeout_s
        with self._lock:
            while not self._idle and self._num_workers >= self.max_workers:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(
                        f"all {self.max_workers} grammar compile workers stayed busy for "
                        f"{self.timeout_s:g} s; retry (or raise grammar_compile_workers)"
                    )
                self._lock.wait(left)
            if self._closed:
                raise EngineShutDown()
            if self._idle:
                return self._idle.pop()
            self._num_workers += 1
        try:
            return CompileWorker(self._tokenizer_info_json)
        except BaseException:
            with self._lock:
                self._num_workers -= 1
                self._lock.notify()
            raise

    def _give_back(self, worker: CompileWorker | None) -> None:
        """Keep a worker idle for the next compile; None (it was killed) frees its seat."""
        with self._lock:
            if worker is not None and not self._closed:
                self._idle.append(worker)
                worker = None
            else:
                self._num_workers -= 1
            self._lock.notify()
        if worker is not None:  # the pool closed while it compiled
            worker.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._num_workers -= len(idle)
            self._lock.notify_all()
        for worker in idle:
            worker.close()


def compile_in_thread(
    compiler: xgr.GrammarCompiler, schema_text: str, timeout_s: float
) -> xgr.CompiledGrammar:
    """Compile in a thread of this process; refuse the schema (CompileDeadlineError) once that
    thread has spent `timeout_s` of CPU time on it. xgrammar releases the GIL while it compiles
    (with max_threads=1, in the calling thread), so the engine loop and other callers run on.

    CPU time, not wall time: several compiles at once on a busy machine each take longer by the
    clock but no more work, and an ordinary schema must not be refused for that (a town decision
    schema on Gemma's 262k vocabulary costs seconds of CPU; several at once on two busy cores
    take a multiple of that each by the clock). A caller still waits at most
    WALL_DEADLINE_FACTOR × timeout_s.
    The compile cannot be interrupted in-process: past the deadline it finishes unread (the
    schema limits bound how long that is)."""
    done: Future = Future()

    def run() -> None:
        try:
            done.set_result(
                compiler.compile_json_schema(
                    schema_text, any_whitespace=False, separators=(",", ":")
                )
            )
        except Exception as exc:
            done.set_exception(exc)

    thread = threading.Thread(target=run, name="grammar-compile", daemon=True)
    thread.start()
    try:
        cpu_clock = time.pthread_getcpuclockid(thread.ident)
    except OSError:  # the thread finished already (a small schema): no clock to read
        thread.join()
        cpu_clock = None
    wall_deadline = time.monotonic() + WALL_DEADLINE_FACTOR * timeout_s
    try:
        while True:
            try:
                return done.result(timeout=min(COMPILE_POLL_S, timeout_s))
            except TimeoutError:
                pass
            if cpu_clock is None:
                continue
            try:
                cpu_s = time.clock_gettime(cpu_clock)
            except OSError:  # the thread ended between the wait and this read
                continue
            if cpu_s >= timeout_s or time.monotonic() >= wall_deadline:
                raise CompileDeadlineError(
                    f"json_schema did not compile within the {timeout_s:g} s deadline "
                    "(grammar_compile_timeout_s): simplify the schema"
                ) from None
    except (RuntimeError, ValueError) as exc:
        if isinstance(exc, CompileDeadlineError):
            raise
        raise ValueError(f"invalid json_schema: {exc}") from exc


class SharedPools:
    """The compile pools of this process, one per tokenizer (and pool settings), shared by every
    engine that uses it: starting a worker costs seconds and ~300 MB (it imports xgrammar), so
    engines of the same model — tests make many — reuse the same workers. A pool closes when its
    last engine releases it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pools: dict[tuple[bytes, int, float], tuple[CompilePool, int]] = {}

    def acquire(self, tokenizer_info_json: bytes, max_workers: int, timeout_s: float):
        key = (hashlib.sha256(tokenizer_info_json).digest(), max_workers, timeout_s)
        with self._lock:
            pool, users = self._pools.get(key, (None, 0))
            if pool is None:
                pool = CompilePool(tokenizer_info_json, max_workers, timeout_s)
            self._pools[key] = (pool, users + 1)
        return pool

    def release(self, pool: CompilePool) -> None:
        with self._lock:
            for key, (candidate, users) in list(self._pools.items()):
                if candidate is pool:
                    if users > 1:
                        self._pools[key] = (pool, users - 1)
                        return
                    del self._pools[key]
                    break
        pool.close()


# Process-wide, like the model files on disk: a resource of the process, not of one engine.
shared_pools = SharedPools()


class CompiledGrammars:
    """Compiled grammars (and refusals) by schema hash, LRU past `max_bytes`; each entry keeps
    the seconds its compile took (by the clock, on whatever ran it). Thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[bytes, tuple[xgr.CompiledGrammar | ValueError, int, float]] = (
            OrderedDict()
        )
        self._num_bytes = 0
        self._lock = threading.Lock()

    def get(self, key: bytes) -> tuple[xgr.CompiledGrammar | ValueError, float] | None:
        """The grammar (or refusal) and its compile's seconds, marked recently used; None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0], entry[2]

    def put(self, key: bytes, value, num_bytes: int, compile_s: float) -> None:
        with self._lock:
            if key in self._entries:  # two engines compiled it at once: keep the first
                return
            self._entries[key] = (value, num_bytes, compile_s)
            self._num_bytes += num_bytes
            while self._num_bytes > self.max_bytes and len(self._entries) > 1:
                _, (_, evicted_bytes, _) = self._entries.popitem(last=False)
                self._num_bytes -= evicted_bytes

    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            return key in self._entries

    @property
    def num_bytes(self) -> int:
        return self._num_bytes


class SharedGrammars:
    """The compiled grammars of this process, one store per tokenizer, compile deadline and
    byte budget (a refusal past a deadline holds for that deadline only): every engine of the
    same model and settings reads and fills the same store."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stores: dict[tuple[bytes, float, int], CompiledGrammars] = {}

    def store_for(
        self, tokenizer_info_json: bytes, timeout_s: float, max_bytes: int
    ) -> CompiledGrammars:
        key = (hashlib.sha256(tokenizer_info_json).digest(), timeout_s, max_bytes)
        with self._lock:
            return self._stores.setdefault(key, CompiledGrammars(max_bytes))

    def clear(self) -> None:
        """Forget every compiled grammar (engines already built keep the stores they hold)."""
        with self._lock:
            self._stores.clear()


# Process-wide, like the compile pools: compiled grammars outlive the engine that compiled them.
shared_grammars = SharedGrammars()


class GrammarCache:
    """An engine's compiled grammars: read from (and written to) a CompiledGrammars store that
    engines of the same tokenizer share; compiles under way are the engine's own, joined by its
    callers of the same schema. Counts its own compiles and hits."""

    def __init__(
        self, compile_fn: Callable[[str], xgr.CompiledGrammar], store: CompiledGrammars
    ) -> None:
        self._compile_fn = compile_fn
        self.store = store
        self._pending: dict[bytes, Future] = {}
        self._lock = threading.Lock()  # guards _pending only; never held while compiling
        self.num_compiles = 0
        self.num_hits = 0

    def get(self, schema_text: str) -> xgr.CompiledGrammar:
        """The schema's compiled grammar, compiled now in this thread if no one has; ValueError
        for a schema that does not compile (the same error each time it is asked for)."""
        future, _ = self.start(schema_text, lambda compile_owned: compile_owned())
        return future.result()  # another caller's compile is bounded by its deadline

    def start(
        self, schema_text: str, submit: Callable[[Callable[[], None]], object]
    ) -> tuple[Future, bool]:
        """A future of the schema's compiled grammar (ValueError: refused) and whether this
        call started its compile: done at once when compiled before (by any engine sharing the
        store); the compile already under way when another caller started it; else a new
        compile, handed to `submit` to run."""
        key = _key(schema_text)
        with self._lock:
            entry = self.store.get(key)
            if entry is not None:
                self.num_hits += 1
                done: Future = Future()
                if isinstance(entry[0], ValueError):
                    done.set_exception(ValueError(str(entry[0])))
                else:
                    done.set_result(entry[0])
                return done, False
            pending = self._pending.get(key)
            if pending is not None:
                return pending, False
            pending = self._pending[key] = Future()
            self.num_compiles += 1
        try:
            submit(lambda: self._compile(key, schema_text, pending))
        except BaseException as exc:  # nothing will run it (shut down)
            self._drop(key, pending, exc)
            raise
        return pending, True

    def is_known(self, schema_text: str) -> bool:
        """Whether the schema is compiled (or refused) already, or being compiled."""
        key = _key(schema_text)
        with self._lock:
            return key in self.store or key in self._pending

    def compile_s(self, schema_text: str) -> float:
        """The seconds the schema's compile took; 0.0 when it is not in the store."""
        entry = self.store.get(_key(schema_text))
        return entry[1] if entry is not None else 0.0

    def _compile(self, key: bytes, schema_text: str, pending: Future) -> None:
        started = time.perf_counter()
        try:
            compiled = self._compile_fn(schema_text)
        except ValueError as exc:
            self._finish(key, pending, exc, len(str(exc)), time.perf_counter() - started)
            return
        except BaseException as exc:  # not the schema's fault (shut down, worker died): retry
            self._drop(key, pending, exc)
            return
        self._finish(
            key, pending, compiled, compiled.memory_size_bytes, time.perf_counter() - started
        )

    def _drop(self, key: bytes, pending: Future, exc: BaseException) -> None:
        with self._lock:
            del self._pending[key]
        pending.set_exception(exc)

    def _finish(self, key: bytes, pending: Future, value, num_bytes: int, compile_s: float) -> None:
        with self._lock:
            self.store.put(key, value, num_bytes, compile_s)
            del self._pending[key]
        if isinstance(value, ValueError):
            pending.set_exception(value)
        else:
            pending.set_result(value)

    @property
    def num_bytes(self) -> int:
        return self.store.num_bytes

    @property
    def num_compiling(self) -> int:
        """Schemas being compiled right now."""
        with self._lock:
            return len(self._pending)


def _key(schema_text: str) -> bytes:
    return hashlib.sha256(schema_text.encode("utf-8", "surrogatepass")).digest()
