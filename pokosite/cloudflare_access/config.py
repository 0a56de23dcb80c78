"""The CF_ACCESS_* settings, validated once per read into a frozen AccessConfig.

Access is on when CF_ACCESS_TEAM_DOMAIN and CF_ACCESS_AUD are both set, off when neither is;
one without the other is a mistake that must not silently leave the site open.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

TEAM_DOMAIN_SUFFIX = ".cloudflareaccess.com"
CERTS_PATH = "/cdn-cgi/access/certs"


@dataclass(frozen=True, slots=True)
class AccessConfig:
    issuer: str  # "https://<team>.cloudflareaccess.com", what the token's `iss` must equal
    audiences: tuple[str, ...]  # AUD tags; the token's `aud` must contain one
    certs_url: str  # the team's JWKS
    leeway_s: int  # clock skew allowed on exp / nbf / iat
    jwks_lifespan_s: int  # how long a fetched key set is trusted before it is fetched again
    jwks_cooldown_s: int  # least time between refreshes forced by unknown key ids
    staff_emails: frozenset[str]
    superuser_emails: frozenset[str]
    staff_groups: frozenset[str]
    superuser_groups: frozenset[str]
    service_token_paths: tuple[str, ...]  # what service tokens may reach ("/api/" = prefix)

    def is_service_path(self, path: str) -> bool:
        return any(
            path.startswith(allowed) if allowed.endswith("/") else path == allowed
            for allowed in self.service_token_paths
        )


def _team_issuer(raw: str) -> str:
    value = raw.strip().rstrip("/")
    if "://" not in value:
        host = value if "." in value else value + TEAM_DOMAIN_SUFFIX
        value = f"https://{host}"
    parts = urlsplit(value)
    if parts.scheme != "https" or not parts.hostname or parts.path or parts.query:
        raise ImproperlyConfigured(
            f"CF_ACCESS_TEAM_DOMAIN={raw!r}: give the team domain, e.g. "
            "'myteam.cloudflareaccess.com' (or 'https://myteam.cloudflareaccess.com')"
        )
    return value


def _is_loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def _certs_url(raw: str, issuer: str) -> str:
    if not raw.strip():
        return issuer + CERTS_PATH
    url = raw.strip()
    parts = urlsplit(url)
    # Keys fetched in the clear from another machine could be swapped on the way.
    if not (parts.scheme == "https" or (parts.scheme == "http" and _is_loopback(parts.hostname))):
        raise ImproperlyConfigured(
            f"CF_ACCESS_CERTS_URL={raw!r}: must be https (plain http only on 127.0.0.1); "
            f"leave it unset to use {issuer + CERTS_PATH}"
        )
    return url


def _folded(name: str, values: Iterable[str]) -> frozenset[str]:
    if isinstance(values, str):
        raise ImproperlyConfigured(f"{name} must be a list of strings, not one string")
    return frozenset(v.strip().casefold() for v in values if v.strip())


def _seconds(name: str, value: object, *, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ImproperlyConfigured(f"{name}={value!r}: must be a whole number >= {minimum}")
    return value


def access_config() -> AccessConfig | None:
    """The Access settings in force, or None when Access is off. Raises ImproperlyConfigured,
    saying what to change, when they are half set or invalid."""
    team = str(getattr(settings, "CF_ACCESS_TEAM_DOMAIN", "") or "")
    aud = str(getattr(settings, "CF_ACCESS_AUD", "") or "")
    if not team.strip() and not aud.strip():
        return None
    if not team.strip() or not aud.strip():
        missing = "CF_ACCESS_AUD" if team.strip() else "CF_ACCESS_TEAM_DOMAIN"
        raise ImproperlyConfigured(
            f"{missing} is not set but the other Cloudflare Access setting is: set both "
            "(CF_ACCESS_TEAM_DOMAIN = the team domain, CF_ACCESS_AUD = the application's "
            "Application Audience (AUD) tag) to turn Access on, or neither for local use"
        )
    issuer = _team_issuer(team)
    paths = tuple(getattr(settings, "CF_ACCESS_SERVICE_TOKEN_PATHS", ("/api/",)))
    if any(not p.startswith("/") for p in paths):
        raise ImproperlyConfigured(
            f"CF_ACCESS_SERVICE_TOKEN_PATHS={list(paths)!r}: each must start with '/' "
            "('/api/' allows everything under it, '/metrics' only that path)"
        )
    return AccessConfig(
        issuer=issuer,
        audiences=tuple(a.strip() for a in aud.split(",") if a.strip()),
        certs_url=_certs_url(str(getattr(settings, "CF_ACCESS_CERTS_URL", "") or ""), issuer),
        leeway_s=_seconds("CF_ACCESS_LEEWAY_S", settings.CF_ACCESS_LEEWAY_S, minimum=0),
        jwks_lifespan_s=_seconds(
            "CF_ACCESS_JWKS_LIFESPAN_S", settings.CF_ACCESS_JWKS_LIFESPAN_S, minimum=1
        ),
        jwks_cooldown_s=_seconds(
            "CF_ACCESS_JWKS_COOLDOWN_S", settings.CF_ACCESS_JWKS_COOLDOWN_S, minimum=0
        ),
        staff_emails=_folded("CF_ACCESS_STAFF_EMAILS", settings.CF_ACCESS_STAFF_EMAILS),
        superuser_emails=_folded("CF_ACCESS_SUPERUSER_EMAILS", settings.CF_ACCESS_SUPERUSER_EMAILS),
        staff_groups=_folded("CF_ACCESS_STAFF_GROUPS", settings.CF_ACCESS_STAFF_GROUPS),
        superuser_groups=_folded("CF_ACCESS_SUPERUSER_GROUPS", settings.CF_ACCESS_SUPERUSER_GROUPS),
        service_token_paths=paths,
    )


def access_is_enabled() -> bool:
    return access_config() is not None


def access_settings_check(
    app_configs: object = None, **kwargs: object
) -> list[checks.CheckMessage]:
    """`manage.py check` (and migrate, runserver) report bad Access settings up front."""
    try:
        access_config()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="cloudflare_access.E001")]
    return []
