"""The settings modules: environment parsing, the pieces Celery and Channels read, production's
refusals. Settings modules are imported in a fresh interpreter so the environment is the test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

REPO_ROOT = Path(__file__).resolve().parents[2]

_DUMP = """
import json, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pokosite.settings.base")
import django
django.setup()
from django.conf import settings as s
from pokosite.celery import app
print(json.dumps({
    "INSTALLED_APPS": s.INSTALLED_APPS,
    "DATABASE": {k: str(v) for k, v in s.DATABASES["default"].items() if k in ("ENGINE", "NAME")},
    "REDIS_URL": s.REDIS_URL,
    "broker": app.conf.broker_url,
    "backend": app.conf.result_backend,
    "acks_late": app.conf.task_acks_late,
    "reject_on_worker_lost": app.conf.task_reject_on_worker_lost,
    "prefetch": app.conf.worker_prefetch_multiplier,
    "track_started": app.conf.task_track_started,
    "default_queue": app.conf.task_default_queue,
    "visibility_timeout": app.conf.broker_transport_options["visibility_timeout"],
    "channel_hosts": s.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"],
    "INFERENCE_NODES": s.INFERENCE_NODES,
    "INFERENCE_ENGINE": s.INFERENCE_ENGINE,
    "INFERENCE_KV_DISK_KEY": s.INFERENCE_KV_DISK_KEY,
    "INFERENCE_OPENAI": s.INFERENCE_OPENAI,
    "compile_shares": [
        s.OPENAI_MAX_COMPILES_PER_IDENTITY,
        s.GRAMMAR_COMPILE_CPU_S_PER_IDENTITY,
        s.GRAMMAR_COMPILE_WINDOW_S,
    ],
    "DEBUG": s.DEBUG,
    "LAUNCHER_CREATES_SUPERUSER": s.LAUNCHER_CREATES_SUPERUSER,
}))
"""

_ENV_NAMES = (
    "REDIS_URL", "DATABASE_URL", "POKOMACHI_NODES", "POKOMACHI_MODEL", "POKOMACHI_DEVICE",
    "POKOMACHI_VAR_DIR", "POKOMACHI_TEST_DB_NAME", "POKOMACHI_TEST_REDIS_URL",
    "POKOMACHI_SECRET_KEY", "POKOMACHI_ALLOWED_HOSTS", "POKOMACHI_VISIBILITY_TIMEOUT",
    "POKOMACHI_DEBUG", "DJANGO_SETTINGS_MODULE", "POKOMACHI_OPENAI_BASE_URL",
    "POKOMACHI_OPENAI_MODEL", "POKOMACHI_OPENAI_API_KEY", "POKOMACHI_STATS_INTERVAL",
    "CF_ACCESS_TEAM_DOMAIN", "CF_ACCESS_AUD", "POKOMACHI_INSECURE_RUN_WITHOUT_ACCESS",
    "POKOMACHI_HSTS_SECONDS", "POKOMACHI_WEIGHTS", "POKOMACHI_KV_KEY",
    "POKOMACHI_OPENAI_MAX_COMPILES", "POKOMACHI_GRAMMAR_COMPILE_CPU_S",
    "POKOMACHI_GRAMMAR_COMPILE_TIMEOUT", "POKOMACHI_GRAMMAR_COMPILE_WORKERS",
)  # fmt: skip


def settings_load(module: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in _ENV_NAMES}
    return subprocess.run(
        [sys.executable, "-c", _DUMP],
        cwd=REPO_ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": module, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def settings_dump(module: str, **env: str) -> dict:
    result = settings_load(module, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_base_defaults_are_the_embedded_setup(tmp_path):
    dumped = settings_dump("pokosite.settings.base", POKOMACHI_VAR_DIR=str(tmp_path))
    assert dumped["INSTALLED_APPS"][0] == "daphne"
    for app in ("channels", "rest_framework", "rest_framework.authtoken", "drf_spectacular"):
        assert app in dumped["INSTALLED_APPS"]
    assert dumped["LAUNCHER_CREATES_SUPERUSER"] is True  # make run's first start
    assert dumped["DATABASE"] == {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(tmp_path / "db.sqlite3"),
    }
    assert dumped["REDIS_URL"] == "redis://127.0.0.1:6379/0"
    assert dumped["broker"] == dumped["backend"] == dumped["REDIS_URL"]
    # A read timeout longer than channels_redis's 5 s BZPOPMIN wait (see settings/base.py).
    assert dumped["channel_hosts"] == [{"address": dumped["REDIS_URL"], "socket_timeout": 30.0}]
    assert dumped["acks_late"] is True
    assert dumped["reject_on_worker_lost"] is True
    assert dumped["prefetch"] == 1
    assert dumped["track_started"] is True
    assert dumped["INFERENCE_NODES"] == ["local"]
    assert dumped["default_queue"] == "local"
    assert dumped["INFERENCE_ENGINE"] == {
        "model": "smollm2-135m-instruct",
        "device": "cpu",
        "retention_interval": None,  # dense: a window checkpoint at every block
        # make run keeps its KV blocks under the var dir, across restarts
        "kv_disk_cache_dir": str(tmp_path / "kv-cache"),
        "kv_disk_cache_bytes": 20 << 30,
        "kv_disk_cache_ttl_s": 3 * 86400.0,
        "kv_host_cache_bytes": 0,
        # a default: an engine the tiers cannot hold (a tensor-parallel one) runs without
        "kv_tiers_where_supported": True,
        "weights": "auto",
        "kv_cache_dtype": "bfloat16",  # 98% of fp32's decisions, half the bytes
        "prefill_chunk_while_decoding": 256,
        # compiles in worker processes, killed past their deadline (issue 33)
        "grammar_compile_workers": 2,
        "grammar_compile_timeout_s": 20.0,
    }
    assert dumped["INFERENCE_OPENAI"]["base_url"] == ""  # our own engine answers
    # A /v1 caller's share of a node's compiles: 4 at once, 120 s of compile in 5 minutes.
    assert dumped["compile_shares"] == [4, 120, 300.0]


def test_the_kv_disk_tier_can_be_turned_off(tmp_path):
    dumped = settings_dump(
        "pokosite.settings.base", POKOMACHI_VAR_DIR=str(tmp_path), POKOMACHI_KV_DISK_DIR="off"
    )
    assert dumped["INFERENCE_ENGINE"]["kv_disk_cache_dir"] is None


def test_the_kv_disk_key_comes_from_its_variable_or_a_real_secret_key(
    tmp_path,
):
    base = dict(POKOMACHI_VAR_DIR=str(tmp_path))
    secret = "s" * 40
    # The placeholder (make run without a secret): none; each engine trusts only its own files.
    assert settings_dump("pokosite.settings.base", **base)["INFERENCE_KV_DISK_KEY"] is None
    derived = settings_dump("pokosite.settings.base", **base, POKOMACHI_SECRET_KEY=secret)
    again = settings_dump("pokosite.settings.base", **base, POKOMACHI_SECRET_KEY=secret)
    key = derived["INFERENCE_KV_DISK_KEY"]
    assert key == again["INFERENCE_KV_DISK_KEY"] and len(key) == 64 and secret not in key
    assert "kv_disk_cache_key" not in derived["INFERENCE_ENGINE"]
    explicit = settings_dump(
        "pokosite.settings.base", **base, POKOMACHI_SECRET_KEY=secret, POKOMACHI_KV_KEY="k" * 32
    )
    assert explicit["INFERENCE_KV_DISK_KEY"] == "k" * 32


def test_base_reads_the_environment(tmp_path):
    dumped = settings_dump(
        "pokosite.settings.base",
        POKOMACHI_VAR_DIR=str(tmp_path),
        REDIS_URL="redis://10.0.0.5:6380/2",
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/pokomachi",
        POKOMACHI_NODES=" spark-a, spark-b ,",
        POKOMACHI_MODEL="smollm2-tiny-random",
        POKOMACHI_DEVICE="cuda:1",
        POKOMACHI_VISIBILITY_TIMEOUT="60",
        POKOMACHI_DEBUG="off",
        POKOMACHI_OPENAI_BASE_URL="http://gpu1:8000/v1",
        POKOMACHI_OPENAI_MODEL="HuggingFaceTB/SmolLM2-135M-Instruct",
        POKOMACHI_RETENTION_INTERVAL="2048",
        POKOMACHI_KV_DISK_DIR="/mnt/kv",
        POKOMACHI_KV_DISK_BYTES="1073741824",
        POKOMACHI_KV_DISK_TTL="604800",
        POKOMACHI_KV_HOST_BYTES="268435456",
        POKOMACHI_WEIGHTS="fp32",
        POKOMACHI_KV_CACHE_DTYPE="auto",
        POKOMACHI_GRAMMAR_COMPILE_TIMEOUT="8.5",
        POKOMACHI_OPENAI_MAX_COMPILES="2",
        POKOMACHI_GRAMMAR_COMPILE_CPU_S="0",
    )
    assert dumped["DATABASE"] == {"ENGINE": "django.db.backends.postgresql", "NAME": "pokomachi"}
    assert dumped["broker"] == dumped["backend"] == "redis://10.0.0.5:6380/2"
    assert [h["address"] for h in dumped["channel_hosts"]] == ["redis://10.0.0.5:6380/2"]
    assert dumped["INFERENCE_NODES"] == ["spark-a", "spark-b"]
    assert dumped["default_queue"] == "spark-a"
    assert dumped["INFERENCE_ENGINE"] == {
        "model": "smollm2-tiny-random",
        "device": "cuda:1",
        "retention_interval": 2048,
        "kv_disk_cache_dir": "/mnt/kv",
        "kv_disk_cache_bytes": 1 << 30,
        "kv_disk_cache_ttl_s": 604800.0,
        "kv_host_cache_bytes": 256 << 20,
        "kv_tiers_where_supported": False,  # asked for: an engine that cannot use them refuses
        "weights": "fp32",
        "kv_cache_dtype": "auto",
        "prefill_chunk_while_decoding": 256,
        "grammar_compile_workers": 2,
        "grammar_compile_timeout_s": 8.5,
    }
    assert dumped["compile_shares"] == [2, 0, 300.0]  # 0: no compile-time budget
    assert dumped["visibility_timeout"] == 60
    assert dumped["DEBUG"] is False
    assert dumped["INFERENCE_OPENAI"] == {
        "base_url": "http://gpu1:8000/v1",
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "api_key": "",
    }


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("POKOMACHI_DEBUG", "maybe", "POKOMACHI_DEBUG='maybe': use one of"),
        ("POKOMACHI_VISIBILITY_TIMEOUT", "soon", "must be a whole number"),
        ("POKOMACHI_RETENTION_INTERVAL", "2k", "POKOMACHI_RETENTION_INTERVAL='2k': must be a"),
        ("POKOMACHI_STATS_INTERVAL", "often", "POKOMACHI_STATS_INTERVAL='often': must be a"),
        ("POKOMACHI_OPENAI_BASE_URL", "http://gpu1:8000/v1", "POKOMACHI_OPENAI_MODEL is not"),
        ("POKOMACHI_OPENAI_MAX_COMPILES", "-1", "must be a whole number from 0 to 10000"),
        ("POKOMACHI_GRAMMAR_COMPILE_CPU_S", "1m", "must be a whole number from 0 to 86400"),
        ("POKOMACHI_GRAMMAR_COMPILE_TIMEOUT", "soon", "must be a number of seconds"),
    ],
)
def test_base_rejects_bad_values_saying_which(tmp_path, name, value, message):
    result = settings_load(
        "pokosite.settings.base", POKOMACHI_VAR_DIR=str(tmp_path), **{name: value}
    )
    assert result.returncode != 0
    assert message in result.stderr


def test_production_refuses_to_start_without_secrets(tmp_path):
    result = settings_load("pokosite.settings.production", POKOMACHI_VAR_DIR=str(tmp_path))
    assert result.returncode != 0
    assert "POKOMACHI_SECRET_KEY must be set in production" in result.stderr
    result = settings_load(
        "pokosite.settings.production",
        POKOMACHI_VAR_DIR=str(tmp_path),
        POKOMACHI_SECRET_KEY="a-long-enough-key-for-this-check-0123456789",
    )
    assert "POKOMACHI_ALLOWED_HOSTS must be set in production" in result.stderr


REAL_KEY = "k" * 20 + "-not-the-placeholder-0123456789"
ACCESS_ON = {
    "CF_ACCESS_TEAM_DOMAIN": "myteam.cloudflareaccess.com",
    "CF_ACCESS_AUD": "aud-tag",
}


def test_production_with_secrets(tmp_path):
    dumped = settings_dump(
        "pokosite.settings.production",
        POKOMACHI_VAR_DIR=str(tmp_path),
        POKOMACHI_SECRET_KEY=REAL_KEY,
        POKOMACHI_ALLOWED_HOSTS="town.example.com",
        **ACCESS_ON,
    )
    assert dumped["DEBUG"] is False
    assert dumped["LAUNCHER_CREATES_SUPERUSER"] is False


@pytest.mark.parametrize(
    "key", ["replace-with-a-long-random-secret", "s3cret", "replace-with-" + "x" * 40]
)
def test_production_refuses_the_placeholder_or_a_short_secret_key(tmp_path, key):
    result = settings_load(
        "pokosite.settings.production",
        POKOMACHI_VAR_DIR=str(tmp_path),
        POKOMACHI_SECRET_KEY=key,
        POKOMACHI_ALLOWED_HOSTS="town.example.com",
        **ACCESS_ON,
    )
    assert result.returncode != 0
    assert "POKOMACHI_SECRET_KEY is the placeholder from .env.example or shorter" in result.stderr


def test_production_refuses_to_start_without_access_unless_told_loudly(tmp_path):
    env = dict(
        POKOMACHI_VAR_DIR=str(tmp_path),
        POKOMACHI_SECRET_KEY=REAL_KEY,
        POKOMACHI_ALLOWED_HOSTS="town.example.com",
    )
    result = settings_load("pokosite.settings.production", **env)
    assert result.returncode != 0
    assert "Cloudflare Access is not configured" in result.stderr
    assert "POKOMACHI_INSECURE_RUN_WITHOUT_ACCESS=true" in result.stderr
    result = settings_load(
        "pokosite.settings.production", POKOMACHI_INSECURE_RUN_WITHOUT_ACCESS="true", **env
    )
    assert result.returncode == 0, result.stderr


_HSTS = """
import django
django.setup()
from django.conf import settings as s
print(s.SECURE_HSTS_SECONDS, s.LOGIN_REQUIRED_WITHOUT_ACCESS, s.TOWN_VIEW_LOGIN_REQUIRED)
"""


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (ACCESS_ON, "31536000 False False"),
        ({**ACCESS_ON, "POKOMACHI_HSTS_SECONDS": "0"}, "0 False False"),
        ({"POKOMACHI_INSECURE_RUN_WITHOUT_ACCESS": "true"}, "31536000 True True"),
    ],
)
def test_production_hsts_is_on_by_default_and_no_access_means_login(tmp_path, extra, expected):
    clean = {k: v for k, v in os.environ.items() if k not in _ENV_NAMES}
    env = {
        **clean,
        "DJANGO_SETTINGS_MODULE": "pokosite.settings.production",
        "POKOMACHI_VAR_DIR": str(tmp_path),
        "POKOMACHI_SECRET_KEY": REAL_KEY,
        "POKOMACHI_ALLOWED_HOSTS": "town.example.com",
        **extra,
    }
    result = subprocess.run(
        [sys.executable, "-c", _HSTS], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == expected


def test_test_settings_share_a_file_database_and_redis_db_15():
    # A file, so worker processes started by tests open the same test database.
    db = settings.DATABASES["default"]
    if db["ENGINE"] == "django.db.backends.sqlite3":
        assert db["TEST"]["NAME"] == db["NAME"]
        assert ":memory:" not in str(db["NAME"])
    expected = os.environ.get("POKOMACHI_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    assert expected == settings.REDIS_URL
    assert settings.CELERY_BROKER_URL == settings.REDIS_URL


def test_a_child_told_the_test_database_uses_it(tmp_path):
    dumped = settings_dump(
        "pokosite.settings.test", POKOMACHI_TEST_DB_NAME=str(tmp_path / "shared.sqlite3")
    )
    assert dumped["DATABASE"]["NAME"] == str(tmp_path / "shared.sqlite3")
    assert dumped["INFERENCE_ENGINE"]["model"] == "smollm2-tiny-random"
