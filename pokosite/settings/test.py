"""Settings for pytest (pytest-django) and for the worker processes that tests start.

The database is a file, not SQLite's :memory:, so a Celery worker started by a test can open the
same test database; one file per pytest process, so runs side by side do not collide. A child
process is told which database the test process uses through POKOMACHI_TEST_DB_NAME (the
`celery_worker_process` fixture in tests/conftest.py sets it).

Redis is the real one on 127.0.0.1:6379, database 15 (POKOMACHI_TEST_REDIS_URL to change it),
never the REDIS_URL the running town uses.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pokosite.env import env_float, env_int, env_str
from pokosite.settings.base import *  # noqa: F403
from pokosite.settings.base import DATABASES, channel_layers

SECRET_KEY = "test-only-secret-key"
DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

_child_db_name = env_str("POKOMACHI_TEST_DB_NAME")
if _child_db_name:
    DATABASES["default"]["NAME"] = _child_db_name
    DATABASES["default"]["TEST"] = {"NAME": _child_db_name}
elif DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    _db_file = str(Path(tempfile.gettempdir()) / f"pokomachi-test-{os.getpid()}.sqlite3")
    DATABASES["default"]["NAME"] = _db_file
    DATABASES["default"]["TEST"] = {"NAME": _db_file}

REDIS_URL = env_str("POKOMACHI_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CHANNEL_LAYERS = channel_layers(REDIS_URL)

# Tests run the tiny random-weight model unless they ask for the real one.
INFERENCE_ENGINE = {
    "model": env_str("POKOMACHI_MODEL", "smollm2-tiny-random"),
    "device": env_str("POKOMACHI_DEVICE", "cpu"),
}
# Compiles in this process (0 workers) unless a test's worker process asks for compile workers.
for _name, _key, _read in (
    ("POKOMACHI_GRAMMAR_COMPILE_WORKERS", "grammar_compile_workers", env_int),
    ("POKOMACHI_GRAMMAR_COMPILE_TIMEOUT", "grammar_compile_timeout_s", env_float),
):
    if env_str(_name):
        INFERENCE_ENGINE[_key] = _read(_name, 0)
if env_str("POKOMACHI_TORCH_THREADS"):
    INFERENCE_ENGINE["num_threads"] = env_int("POKOMACHI_TORCH_THREADS", 0, low=1, high=1024)
# The KV pool's size in blocks of 16 tokens (unset: the engine's byte budget decides).
if env_str("POKOMACHI_KV_BLOCKS"):
    INFERENCE_ENGINE["num_kv_blocks"] = env_int("POKOMACHI_KV_BLOCKS", 0, low=1, high=10_000_000)
