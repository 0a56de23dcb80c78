"""Project-wide fixtures. Tests run on pokosite.settings.test (see its docstring).

redis_url -> str
    The real Redis the tests use: settings.REDIS_URL, redis://127.0.0.1:6379/15 unless
    POKOMACHI_TEST_REDIS_URL says otherwise. Skips the test, saying how to start Redis, when it
    does not answer PING. It is never flushed (other test runs may share it): use unique keys and
    queue names.

Every test starts with torch's thread count as the process had it before the test, and with no
compiled grammars in this process (grammar_compiler.shared_grammars:
engines of one tokenizer share them), so what one test compiled is not another's cache hit.

celery_worker_process -> start(queue=None, *, env=None, concurrency=4, ready_timeout_s=180.0)
    Starts a real `celery -A pokosite worker -Q <queue> --pool threads` subprocess and returns a
    WorkerProcess once the worker logged "ready." (its engine is loaded by then, see
    inference/fleet/worker.py). Every worker started is killed at teardown.
      queue    the queue (= node name) it consumes; default a fresh `test-<hex>` name, so test
               runs side by side never take each other's tasks. The fixture adds it to
               settings.INFERENCE_NODES of the test process, so `node_require(queue)` passes.
      env      extra environment for the worker, e.g. {"POKOMACHI_MODEL":
               "smollm2-135m-instruct"} for the real model (the default is smollm2-tiny-random)
               or {"POKOMACHI_VISIBILITY_TIMEOUT": "5"} so a killed worker's unacknowledged task
               is handed to the next worker on that queue within seconds.
    The worker runs the test settings on the same test database (POKOMACHI_TEST_DB_NAME) and
    Redis (POKOMACHI_TEST_REDIS_URL). It only sees committed rows, so the fixture puts the test
    on a transactional database (like @pytest.mark.django_db(transaction=True)).
    WorkerProcess: .queue, .hostname, .pid, .output() (everything it printed), .is_alive(),
    .kill() (SIGKILL: a crash, mid-task if one runs), .stop(timeout_s) (SIGTERM: warm shutdown,
    running tasks finish first; killed after timeout_s).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from itertools import count
from pathlib import Path

import pytest
import redis
from django.conf import settings

from tests.child_processes import child_env

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _torch_threads_as_found() -> Iterator[None]:
    """A benchmark's main() or an engine may set torch's thread count for the whole process:
    a later test (in this process, whichever pytest-xdist hands it) finds the count it started
    with (test_kv_tiers' OpenMP test was skipped after v4-ops' test set it to one)."""
    import torch

    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _no_compiled_grammars_from_other_tests() -> None:
    from inference.engine.structured_output.grammar_compiler import shared_grammars

    shared_grammars.clear()


@pytest.fixture(scope="session")
def redis_url() -> str:
    url = settings.REDIS_URL
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(
            f"Redis at {url} is not answering ({exc}); start it with "
            "`redis-server --port 6379 --save ''` (or run .ci/run), "
            "or point POKOMACHI_TEST_REDIS_URL at one"
        )
    finally:
        client.close()
    return url


class WorkerProcess:
    """A `celery -A pokosite worker` child process started by a test."""

    def __init__(self, queue: str, hostname: str, argv: list[str], env: Mapping[str, str]):
        self.queue = queue
        self.hostname = hostname
        self._lines: list[str] = []
        self._ready = threading.Event()
        self.process = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.append(line)
            if f"{self.hostname} ready." in line:
                self._ready.set()

    def wait_ready(self, timeout_s: float) -> None:
        deadline_hit = not self._ready.wait(timeout_s)
        if deadline_hit or not self.is_alive():
            self.kill()
            why = "did not get ready" if deadline_hit else "exited"
            pytest.fail(
                f"celery worker {self.hostname} {why} within {timeout_s} s; "
                f"its output:\n{self.output()[-6000:]}"
            )

    def output(self) -> str:
        return "".join(self._lines)

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.is_alive():
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.is_alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reader.join(timeout=2)


def worker_process_start(
    redis_url: str,
    queue: str,
    hostname: str,
    *,
    env: Mapping[str, str] | None = None,
    concurrency: int = 4,
    ready_timeout_s: float = 180.0,
) -> WorkerProcess:
    """A ready `celery worker` on `queue` (celery_worker_process's, for a fixture of wider scope
    that stops it itself)."""
    worker_env = child_env(
        "pokosite.settings.test", redis_url, {"POKOMACHI_NODES": queue, **(env or {})}
    )
    argv = [
        sys.executable, "-m", "celery", "-A", "pokosite", "worker",
        "-Q", queue, "--pool", "threads", "--concurrency", str(concurrency),
        "-n", hostname, "--loglevel", "INFO", "--without-mingle", "--without-gossip",
    ]  # fmt: skip
    worker = WorkerProcess(queue, hostname, argv, worker_env)
    try:
        worker.wait_ready(ready_timeout_s)
    except BaseException:
        worker.kill()
        raise
    return worker


@pytest.fixture
def celery_worker_process(
    redis_url: str, transactional_db: None, settings
) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []
    serial = count()

    def start(
        queue: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        concurrency: int = 4,
        ready_timeout_s: float = 180.0,
    ) -> WorkerProcess:
        queue = queue or f"test-{uuid.uuid4().hex[:12]}"
        if queue not in settings.INFERENCE_NODES:
            settings.INFERENCE_NODES = [*settings.INFERENCE_NODES, queue]
        hostname = f"{queue}-{next(serial)}@{uuid.uuid4().hex[:6]}"
        worker = worker_process_start(
            redis_url,
            queue,
            hostname,
            env=env,
            concurrency=concurrency,
            ready_timeout_s=ready_timeout_s,
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop(timeout_s=5.0)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` need CUDA; without it they are skipped, saying so."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marked gpu)")
    for item in items:
        # The marker, not `"gpu" in item.keywords`: keywords also hold the names of the folders
        # above the test, so a checkout in a folder named gpu skipped every test.
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
