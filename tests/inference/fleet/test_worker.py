"""A node worker whose engine cannot load stops at start-up, saying why, instead of taking
tasks it would fail."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_a_worker_with_an_unloadable_model_exits_saying_why(redis_url):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "pokosite.settings.test",
        "POKOMACHI_TEST_REDIS_URL": redis_url,
        "POKOMACHI_MODEL": "no-such-model.gguf",
        "POKOMACHI_NODES": "test-unloadable",
    }
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "pokosite", "worker", "-Q", "test-unloadable",
         "--pool", "threads", "-n", "test-unloadable@test", "--without-mingle",
         "--without-gossip"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "engine failed to load" in output
    assert "unknown model 'no-such-model.gguf'" in output
    assert "test-unloadable@test ready." not in output
