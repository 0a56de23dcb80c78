"""Fixtures of the inference app's tests (the project-wide ones are in tests/conftest.py).

openai_server -> (base URL, WorkerProcess)
    daphne serving pokosite on a free port of 127.0.0.1 (base URL ends in /v1), its one node a
    real Celery worker (tiny model) from `celery_worker_process`. The server uses its own
    metrics prefix, and gives up on a silent streaming worker after 3 s
    (POKOMACHI_STREAM_IDLE_TIMEOUT), so a killed worker shows quickly.

module_openai_server -> (base URL, WorkerProcess)
    The same, started once per test module, for a module whose tests only send it requests
    (never one that kills or stops its worker). The tests still get no database of their own
    from it: ask for `transactional_db` where they need one.

daphne_start(worker, redis_url, env=None) -> context manager yielding the /v1 base URL
    The same server for a worker a test started itself (e.g. on the real model).
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.child_processes import child_env, daphne_serving
from tests.conftest import worker_process_start

STREAM_IDLE_TIMEOUT_S = 3


@contextlib.contextmanager
def daphne_start(worker, redis_url: str, *, env: dict[str, str] | None = None) -> Iterator[str]:
    """daphne (tests/child_processes.daphne_serving) with `worker`'s queue as its one node;
    yields the /v1 base URL, stops the server on exit."""
    extra = {
        "POKOMACHI_NODES": worker.queue,
        "POKOMACHI_METRICS_PREFIX": f"test-metrics-{uuid.uuid4().hex[:8]}",
        "POKOMACHI_STREAM_IDLE_TIMEOUT": str(STREAM_IDLE_TIMEOUT_S),
        **(env or {}),
    }
    with (
        tempfile.TemporaryDirectory() as scratch,
        daphne_serving(
            child_env("pokosite.settings.test", redis_url, extra), Path(scratch) / "daphne.log"
        ) as url,
    ):
        yield f"{url}/v1"


@pytest.fixture
def openai_server(celery_worker_process, redis_url):
    """(base URL, worker): daphne serving pokosite on a free port, its one node a real worker."""
    worker = celery_worker_process()
    with daphne_start(worker, redis_url) as base_url:
        yield base_url, worker


@pytest.fixture(scope="module")
def module_openai_server(django_db_setup, redis_url):
    """openai_server once for the module: a start costs 13-20 s of a 2-core machine."""
    queue = f"test-{uuid.uuid4().hex[:12]}"
    worker = worker_process_start(redis_url, queue, f"{queue}-0@{uuid.uuid4().hex[:6]}")
    try:
        with daphne_start(worker, redis_url) as base_url:
            yield base_url, worker
    finally:
        worker.stop(timeout_s=5.0)
