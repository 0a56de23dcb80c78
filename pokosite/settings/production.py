"""Production settings: behind a TLS-terminating proxy (Cloudflare Tunnel), secrets from the
environment. Refuses to start without POKOMACHI_SECRET_KEY and POKOMACHI_ALLOWED_HOSTS.

Static files are served by whitenoise from STATIC_ROOT (`manage.py collectstatic`, which the
Dockerfile runs), placed after the Cloudflare Access middleware so they too need a token.
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from pokosite.settings.base import *  # noqa: F403
from pokosite.settings.base import MIDDLEWARE, env_bool, env_int, env_list


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
# Cloudflare sends visitors to https at the edge; the only plain-http callers are the health
# checks inside the compose network, which a redirect would break. HSTS is off unless asked for
# (browsers remember it long after a wrong setting is fixed).
SECURE_SSL_REDIRECT = env_bool("POKOMACHI_SSL_REDIRECT", False)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SECURE_HSTS_SECONDS = env_int("POKOMACHI_HSTS_SECONDS", 0)

_ACCESS_MIDDLEWARE = "pokosite.cloudflare_access.middleware.CloudflareAccessMiddleware"
MIDDLEWARE = [*MIDDLEWARE]
MIDDLEWARE.insert(
    MIDDLEWARE.index(_ACCESS_MIDDLEWARE) + 1, "whitenoise.middleware.WhiteNoiseMiddleware"
)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Hashed names (cache forever) and pre-compressed copies; needs collectstatic.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
