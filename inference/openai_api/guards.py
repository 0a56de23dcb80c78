"""What a browser cannot send to /v1 behind its user's back. A page on another site can make a
user's browser POST with their cookies (Access's CF_Authorization, the Django session) only as a
"simple" request: a form-like Content-Type and no custom headers. So a POST must say
`Content-Type: application/json` (which a cross-site page can only send after a CORS preflight
that this server never grants), and a request whose Origin header names another site is refused
outright. Clients that are not browsers send no Origin and are not affected.

API keys (vLLM's --api-key): with settings.OPENAI_API_KEYS set (POKOMACHI_API_KEYS), every /v1
request must carry one of them as `Authorization: Bearer <key>`; a missing or wrong key is a 401
in OpenAI's shape. Unset, /v1 reads no key (docs/api.md, "API keys on /v1").
"""

from __future__ import annotations

import contextlib
import functools
import hmac
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, JsonResponse

from inference.openai_api.protocol import OpenAIError

View = Callable[[HttpRequest], Awaitable[HttpResponse]]


def _own_origins(request: HttpRequest) -> set[str]:
    origins = {origin.rstrip("/") for origin in getattr(settings, "CSRF_TRUSTED_ORIGINS", [])}
    with contextlib.suppress(DisallowedHost):  # not this site at all: only trusted origins
        origins.add(f"{request.scheme}://{request.get_host()}")
    return origins


def refusal(request: HttpRequest) -> OpenAIError | None:
    """Why this request may not reach the view, or None."""
    origin = request.headers.get("Origin")
    if origin is not None:
        parts = urlsplit(origin)
        normalized = f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""
        if normalized not in _own_origins(request):
            return OpenAIError(
                f"cross-origin requests are refused: Origin {origin!r} is not this site",
                status=403,
                type_="permission_error",
            )
    if request.method == "POST" and request.content_type != "application/json":
        return OpenAIError(
            f"Content-Type must be application/json, got {request.content_type or 'none'!r}",
            status=415,
        )
    return None


def api_key_refusal(request: HttpRequest) -> OpenAIError | None:
    """Why the request's API key is refused (keys configured, and none of them sent), or None."""
    keys = getattr(settings, "OPENAI_API_KEYS", [])
    if not keys:
        return None
    scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
    sent = sent.strip() if scheme.lower() == "bearer" else ""
    # Compared in constant time, against every key, so the timing tells nothing of which.
    matches = [hmac.compare_digest(sent.encode(), key.encode()) for key in keys]
    if sent and any(matches):
        return None
    why = "no API key was sent" if not sent else "the API key sent is not one of this server's"
    return OpenAIError(
        f"{why}: send Authorization: Bearer <key> with a key from POKOMACHI_API_KEYS",
        status=401,
        code="invalid_api_key",
    )


def _guard(refuse: Callable[[HttpRequest], OpenAIError | None]) -> Callable[[View], View]:
    """A view decorator answering `refuse`'s refusal as JSON instead of calling the view."""

    def decorate(view: View) -> View:
        @functools.wraps(view)
        async def guarded(request: HttpRequest) -> HttpResponse:
            refused = refuse(request)
            if refused is not None:
                return JsonResponse(refused.body(), status=refused.status)
            return await view(request)

        return guarded

    return decorate


api_key_required = _guard(api_key_refusal)
same_site_json = _guard(refusal)
