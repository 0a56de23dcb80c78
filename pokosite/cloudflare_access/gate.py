"""One decision for HTTP requests and WebSocket connects alike: may this token reach this path,
and as whom. Blocking (a key fetch, a user lookup): async callers run it in a thread."""

from __future__ import annotations

import logging

from django.contrib.auth.models import AbstractBaseUser

from pokosite.cloudflare_access.config import AccessConfig
from pokosite.cloudflare_access.tokens import AccessDenied, AccessIdentity, verifier_for
from pokosite.cloudflare_access.users import access_user_sync

logger = logging.getLogger(__name__)

# The one path left open, for the tunnel's and the container's health checks.
OPEN_PATH = "/healthz"


def access_authenticate(
    *, config: AccessConfig, token: str | None, path: str
) -> tuple[AbstractBaseUser, AccessIdentity]:
    """The user and identity this token proves; AccessDenied (with a loggable reason) if none."""
    if not token:
        raise AccessDenied("no token")
    verifier = verifier_for(
        certs_url=config.certs_url,
        issuer=config.issuer,
        audiences=config.audiences,
        leeway_s=config.leeway_s,
        jwks_lifespan_s=config.jwks_lifespan_s,
        jwks_cooldown_s=config.jwks_cooldown_s,
    )
    identity = verifier.verify(token)
    if identity.is_service and not config.is_service_path(path):
        raise AccessDenied("service token outside the API")
    user = access_user_sync(identity=identity, config=config)
    if not user.is_active:
        raise AccessDenied("user is deactivated")
    return user, identity


def refusal_log(*, protocol: str, path: str, client: str, reason: str) -> None:
    logger.warning("Access refused %s %s from %s: %s", protocol, path, client, reason)
