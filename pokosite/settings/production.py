"""Production settings: behind a TLS-terminating proxy (Cloudflare Tunnel), secrets from the
environment. Refuses to start without POKOMACHI_SECRET_KEY (a real one: not the placeholder,
at least 32 characters) and POKOMACHI_ALLOWED_HOSTS, and without Cloudflare Access unless
POKOMACHI_INSECURE_RUN_WITHOUT_ACCESS=true says so.

Static files are served by whitenoise from STATIC_ROOT (`manage.py collectstatic`, which the
Dockerfile runs), placed after the Cloudflare Access middleware so they too need a token.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from pokosite.env import env_bool, env_int, env_list, env_str
from pokosite.settings.base import *  # noqa: F403
from pokosite.settings.base import CF_ACCESS_TEAM_DOMAIN, MIDDLEWARE, TOWN_VIEW_LOGIN_REQUIRED


def _env_required(name: str, hint: str) -> str:
    value = env_str(name)
    if not value:
        raise ImproperlyConfigured(f"{name} must be set in production: {hint}")
    return value


DEBUG = False
LAUNCHER_CREATES_SUPERUSER = False  # no account with a printed password here
_SECRET_KEY_HINT = 'generate one with python -c "import secrets; print(secrets.token_urlsafe(50))"'
SECRET_KEY = _env_required("POKOMACHI_SECRET_KEY", _SECRET_KEY_HINT)
# The key signs sessions and derives the cache salts: a copied placeholder or a short key would
# let anyone who read .env.example forge them.
MIN_SECRET_KEY_LENGTH = 32
if "replace-with" in SECRET_KEY or len(SECRET_KEY) < MIN_SECRET_KEY_LENGTH:
    raise ImproperlyConfigured(
        f"POKOMACHI_SECRET_KEY is the placeholder from .env.example or shorter than "
        f"{MIN_SECRET_KEY_LENGTH} characters: {_SECRET_KEY_HINT}"
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
# HSTS on by default (a year). Django sends it on https requests only, so the compose health
# checks on plain http are not affected; POKOMACHI_HSTS_SECONDS=0 turns it off.
SECURE_HSTS_SECONDS = env_int("POKOMACHI_HSTS_SECONDS", 31_536_000)

# Production never fails open: without Cloudflare Access configured it refuses to start, unless
# this loudly named setting says the site is meant to run without it. Then every page of the
# town still needs a logged-in user, and so do /v1, /metrics and the API (LoginRequiredMiddleware
# in pokosite/cloudflare_access/login_required.py).
RUN_WITHOUT_ACCESS_ENV = "POKOMACHI_INSECURE_RUN_WITHOUT_ACCESS"
RUN_WITHOUT_ACCESS = env_bool(RUN_WITHOUT_ACCESS_ENV, False)
if not CF_ACCESS_TEAM_DOMAIN.strip() and not RUN_WITHOUT_ACCESS:
    raise ImproperlyConfigured(
        "Cloudflare Access is not configured: set CF_ACCESS_TEAM_DOMAIN and CF_ACCESS_AUD (see "
        "docs/deploy.md, 'Deploying behind Cloudflare Access'), or set "
        f"{RUN_WITHOUT_ACCESS_ENV}=true to run production without it (every page, /v1, /metrics "
        "and the API then need a login)"
    )
LOGIN_REQUIRED_WITHOUT_ACCESS = RUN_WITHOUT_ACCESS
TOWN_VIEW_LOGIN_REQUIRED = TOWN_VIEW_LOGIN_REQUIRED or RUN_WITHOUT_ACCESS

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
