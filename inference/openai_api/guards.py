"""What a browser cannot send to /v1 behind its user's back. A page on another site can make a
user's browser POST with their cookies (Access's CF_Authorization, the Django session) only as a
"simple" request: a form-like Content-Type and no custom headers. So a POST must say
`Content-Type: application/json` (which a cross-site page can only send after a CORS preflight
that this server never grants), and a request whose Origin header names another site is refused
outright. Clients that are not browsers send no Origin and are not affected.
"""

from __future__ import annotations

import contextlib
import functools
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


def same_site_json(view: View) -> View:
    @functools.wraps(view)
    async def guarded(request: HttpRequest) -> HttpResponse:
        refused = refusal(request)
        if refused is not None:
            return JsonResponse(refused.body(), status=refused.status)
        return await view(request)

    return guarded
