"""The deployed site's static files: `collectstatic` under production settings writes the
manifest, and the pages then render through the manifest storage (a missing file or source map
named by a vendored file fails collectstatic, and without a manifest every page is a 500)."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

_SERVE = """
import django
django.setup()
from django.core.management import call_command
from django.contrib.auth import get_user_model
from django.test import Client
call_command("migrate", verbosity=0)
user = get_user_model().objects.create_superuser("ops", "ops@example.com", "pw-not-used")
anonymous, client = Client(), Client()
client.force_login(user)
login = anonymous.get("/admin/login/", HTTP_HOST="town.example.com", secure=True)
town = client.get("/", HTTP_HOST="town.example.com", secure=True)
admin = client.get("/admin/", HTTP_HOST="town.example.com", secure=True)
print("STATUS", login.status_code, town.status_code, admin.status_code)
page = login.content.decode()
css = page.split('href="/static/admin/css/base.')[1].split('"')[0]
print("HASHED", "/static/admin/css/base." + css)
static = anonymous.get("/static/admin/css/base." + css, HTTP_HOST="town.example.com", secure=True)
print("STATIC", static.status_code)
"""


def _production_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POKOMACHI_", "CF_ACCESS_"))}
    return {
        **env,
        "DJANGO_SETTINGS_MODULE": "pokosite.settings.production",
        "POKOMACHI_SECRET_KEY": secrets.token_urlsafe(50),
        "POKOMACHI_ALLOWED_HOSTS": "town.example.com",
        "POKOMACHI_INSECURE_RUN_WITHOUT_ACCESS": "true",
        "POKOMACHI_VAR_DIR": str(tmp_path / "var"),
        "POKOMACHI_STATIC_ROOT": str(tmp_path / "static"),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
    }


def _dockerfile_collectstatic_env() -> dict[str, str]:
    """The variables the Dockerfile sets for its collectstatic step."""
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    (step,) = re.findall(r"^RUN ((?:[^\n]*\\\n)*[^\n]*collectstatic[^\n]*)", dockerfile, re.M)
    return dict(re.findall(r"(POKOMACHI_\w+)=(\S+)", step))


def test_collectstatic_under_production_settings_then_the_pages_serve(tmp_path):
    env = _production_env(tmp_path)
    build_env = {**env, **_dockerfile_collectstatic_env()}  # as the image build runs it
    assert "POKOMACHI_SECRET_KEY" in _dockerfile_collectstatic_env()
    collected = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput"],
        cwd=REPO_ROOT, env=build_env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert collected.returncode == 0, collected.stderr[-3000:]
    assert (tmp_path / "static" / "staticfiles.json").is_file()
    served = subprocess.run(
        [sys.executable, "-c", _SERVE],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert served.returncode == 0, served.stderr[-3000:]
    assert "STATUS 200 200 200" in served.stdout, served.stdout + served.stderr[-3000:]
    # The page names the hashed file from the manifest, and whitenoise serves it.
    assert "STATIC 200" in served.stdout, served.stdout
