"""Fixtures of the inference app's tests (the project-wide ones are in tests/conftest.py).

openai_server -> (base URL, WorkerProcess)
    daphne serving pokosite on a free port of 127.0.0.1 (base URL ends in /v1), its one node a
    real Celery worker (tiny model) from `celery_worker_process`. The server uses its own
    metrics prefix, and gives up on a silent streaming worker after 3 s
    (POKOMACHI_STREAM_IDLE_TIMEOUT), so a killed worker shows quickly.

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
