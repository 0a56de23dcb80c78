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
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
STREAM_IDLE_TIMEOUT_S = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def daphne_start(worker, redis_url: str, *, env: dict[str, str] | None = None) -> Iterator[str]:
    """daphne serving pokosite on a free port with `worker`'s queue as its one node; yields the
    /v1 base URL, stops the server on exit."""
    from django.db import connection

    port = _free_port()
    child_env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "pokosite.settings.test",
        "POKOMACHI_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        "POKOMACHI_TEST_REDIS_URL": redis_url,
        "POKOMACHI_NODES": worker.queue,
        "POKOMACHI_METRICS_PREFIX": f"test-metrics-{uuid.uuid4().hex[:8]}",
        "POKOMACHI_STREAM_IDLE_TIMEOUT": str(STREAM_IDLE_TIMEOUT_S),
        **(env or {}),
    }
    argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
            "pokosite.asgi:application"]  # fmt: skip
    server = subprocess.Popen(
        argv,
        cwd=REPO_ROOT,
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"daphne did not start: {server.stdout.read()[-4000:]}")
            time.sleep(0.2)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


@pytest.fixture
def openai_server(celery_worker_process, redis_url):
    """(base URL, worker): daphne serving pokosite on a free port, its one node a real worker."""
    worker = celery_worker_process()
    with daphne_start(worker, redis_url) as base_url:
        yield base_url, worker
