"""With Redis (the task queue) down, the web answers within ~2 s with a 503 in each API's own
shape that says what is down, a decision that could not be sent is left pending (not queued with
no message), and once Redis is back the same request goes through.

Runs in a child process whose settings point at a Redis of its own on a free port, which the
script stops and starts: the test process's Celery app keeps its own connections.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import json, os, subprocess, sys, time
import django
django.setup()
from django.test.utils import setup_test_environment
setup_test_environment()  # ALLOWED_HOSTS takes the test client's host
from django.core.management import call_command
from django.contrib.auth import get_user_model
from django.test import Client
from inference.services import completion_model
from tests.town.factories import small_town_factory
from town import services
from town.models import Decision

call_command("migrate", verbosity=0)
port = int(os.environ["QUEUE_PORT"])
client = Client()
client.force_login(get_user_model().objects.create_superuser("ops", "ops@example.com", "pw"))
town = small_town_factory()
run = services.run_create(town=town, nodes=["local"])
aki = town.residents.get(name="Aki")
chat = {"model": completion_model(), "messages": [{"role": "user", "content": "hi"}]}
out = {}

started = time.monotonic()
v1 = client.post("/v1/chat/completions", json.dumps(chat), content_type="application/json")
out["v1"] = [v1.status_code, v1.json(), time.monotonic() - started]
started = time.monotonic()
api = client.post("/api/decisions/", {"run": run.pk, "resident": aki.pk},
                  content_type="application/json")
out["api"] = [api.status_code, api.json(), time.monotonic() - started]
out["statuses_down"] = sorted(Decision.objects.values_list("status", flat=True))

server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly",
                           "no", "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL)
try:
    import redis
    for _ in range(100):
        try:
            redis.Redis(port=port).ping()
            break
        except redis.RedisError:
            time.sleep(0.05)
    again = client.post("/api/decisions/", {"run": run.pk, "resident": aki.pk},
                        content_type="application/json")
    out["api_again"] = [again.status_code, again.json()]
    out["statuses_up"] = sorted(Decision.objects.values_list("status", flat=True))
    out["queued_messages"] = redis.Redis(port=port, db=15).llen("local")
finally:
    server.terminate()
    server.wait()
print("RESULT " + json.dumps(out))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.skipif(not shutil.which("redis-server"), reason="needs the redis-server binary")
def test_with_redis_down_the_apis_answer_503_fast_and_a_retry_goes_through(tmp_path):
    port = _free_port()  # nothing listens there until the script starts its Redis
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("POKOMACHI_")},
        "DJANGO_SETTINGS_MODULE": "pokosite.settings.test",
        "POKOMACHI_TEST_REDIS_URL": f"redis://127.0.0.1:{port}/15",
        "POKOMACHI_TEST_DB_NAME": str(tmp_path / "db.sqlite3"),
        "POKOMACHI_NODES": "local",
        "QUEUE_PORT": str(port),
        "PYTHONPATH": str(REPO_ROOT),
    }
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")]
    out = json.loads(line.removeprefix("RESULT "))

    status, body, elapsed_s = out["v1"]
    assert status == 503 and elapsed_s < 3.0, out["v1"]
    assert body["error"]["code"] == "queue_down" and body["error"]["type"] == "server_error"
    assert f"the task queue (Redis at redis://127.0.0.1:{port})" in body["error"]["message"]

    status, body, elapsed_s = out["api"]
    assert status == 503 and elapsed_s < 3.0, out["api"]
    assert "the task queue (Redis at" in body["detail"] and "retry" in body["detail"]
    assert out["statuses_down"] == ["pending"] * 4  # nothing left queued with no message

    status, body = out["api_again"]
    assert status == 202 and body["status"] == "queued", out["api_again"]
    assert out["statuses_up"] == ["pending", "pending", "pending", "queued"]
    assert out["queued_messages"] == 1  # the decision's message is on the node's queue
