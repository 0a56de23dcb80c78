"""Who may share cached prompt state: the cache salt of every request, set by the server.

Reuse is token-exact and its count is reported (usage.prompt_tokens_details.cached_tokens), so a
caller who could share another's cache could read their prompt back a few tokens at a time by
guessing (sharper than vLLM's CVE-2025-46570 timing channel). So:
- a /v1 request's salt is an HMAC, under SECRET_KEY, of who sent it: the Access identity, the
  service token, or the Django user (a session or a DRF token); callers with no identity (local
  use, Access off, nobody logged in) share one anonymous namespace;
- a client's own `cache_salt` is mixed into its identity's salt: it narrows sharing (only the same
  identity with the same salt shares), never widens it;
- the town's runs have salts of their own namespace ("town:"), which no /v1 input yields;
- POKOMACHI_V1_SHARED_CACHE=true (settings.V1_SHARED_CACHE) lets every /v1 caller share one
  namespace, still apart from the town's.
"""

from __future__ import annotations

import hashlib
import hmac

from django.conf import settings
from django.http import HttpRequest

PURPOSE = "pokomachi.cache-salt.v1"
SHARED = "shared"
ANONYMOUS = "anonymous"


def _mac(*parts: str) -> str:
    key = hmac.new(settings.SECRET_KEY.encode(), PURPOSE.encode(), hashlib.sha256).digest()
    message = "\x1f".join(parts).encode("utf-8", "surrogatepass")
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:32]


def v1_cache_salt(*, identity: str | None, client_salt: str | None) -> str:
    """The salt of a /v1 request from `identity` (request_identity), narrowed by the client's."""
    who = SHARED if getattr(settings, "V1_SHARED_CACHE", False) else (identity or ANONYMOUS)
    parts = ("v1", who) if client_salt is None else ("v1", who, "client", client_salt)
    return "v1:" + _mac(*parts)


def run_cache_salt(run_id: int) -> str:
    """The salt of a town run's decisions: its own, not guessable from the run id."""
    return "town:" + _mac("town", "run", str(run_id))


async def request_identity(request: HttpRequest) -> str | None:
    """Who sent the request, as a stable key; None for an anonymous caller."""
    identity = getattr(request, "cf_access_identity", None)
    if identity is not None:
        return f"access:{identity.email}" if identity.email else f"service:{identity.common_name}"
    # Set by the Access or the token middleware when they authenticated; else the session's.
    user = request.__dict__.get("_cached_user") or await request.auser()
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}"
    return None
