"""What the tests that start a server or a worker process share.

child_env(settings_module, redis_url, extra=None) -> dict
    This process's environment for a child on `settings_module`, this test's database and
    `redis_url` (read by pokosite/settings/test.py), unbuffered; `extra` last (it wins).
daphne_serving(env, log_path) -> context manager yielding a WebServer (a str: the base URL)
    daphne serving pokosite.asgi on a free port of 127.0.0.1, once /healthz answers; stopped
    on exit. .log() is everything it printed (to log_path: a pipe nobody reads would fill up
    and stall it).
free_port() -> int
    A port of 127.0.0.1 nothing listens on just now.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(
    settings_module: str, redis_url: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    from django.db import connection

    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": settings_module,
        "POKOMACHI_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        "POKOMACHI_TEST_REDIS_URL": redis_url,
        "PYTHONUNBUFFERED": "1",
        **(extra or {}),
    }


class WebServer(str):
    """The server's base URL; .log() is everything daphne printed so far."""

    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def daphne_serving(env: Mapping[str, str], log_path: Path) -> Iterator[WebServer]:
    port = free_port()
    argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    url = WebServer(f"http://127.0.0.1:{port}")
    url.log_path = log_path
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [*argv, "pokosite.asgi:application"],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"daphne did not serve {url}/healthz; its output:\n{url.log()}")
            time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
