"""Production settings: behind a TLS-terminating proxy (Cloudflare Tunnel), secrets from the
environment. Refuses to start without POKOMACHI_SECRET_KEY and POKOMACHI_ALLOWED_HOSTS."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from pokosite.settings.base import *  # noqa: F403
from pokosite.settings.base import env_list


def _env_required(name: str, hint: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise ImproperlyConfigured(f"{name} must be set in production: {hint}")
    return value


DEBUG = False
SECRET_KEY = _env_required(
    "POKOMACHI_SECRET_KEY",
    'generate one with python -c "import secrets; print(secrets.token_urlsafe(50))"',
)
_env_required("POKOMACHI_ALLOWED_HOSTS", "a comma-separated list, e.g. town.example.com")
ALLOWED_HOSTS = env_list("POKOMACHI_ALLOWED_HOSTS", [])
CSRF_TRUSTED_ORIGINS = env_list(
    "POKOMACHI_CSRF_TRUSTED_ORIGINS", [f"https://{host}" for host in ALLOWED_HOSTS]
)

# The proxy terminates TLS and says so in X-Forwarded-Proto.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
