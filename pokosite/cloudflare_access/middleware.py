"""Django HTTP middleware: with Access on, a request without a valid Access JWT gets 403 (the
reason goes to the log); with one, request.user is the token's user for everything after it
(admin, views, DRF) and request.cf_access_identity says who. Only /healthz stays open.

Sits right after AuthenticationMiddleware, so the token's user replaces any session user.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseForbidden

from pokosite.cloudflare_access.config import access_config
from pokosite.cloudflare_access.gate import OPEN_PATH, access_authenticate, refusal_log
from pokosite.cloudflare_access.tokens import COOKIE_NAME, HEADER_NAME, AccessDenied, token_pick

FORBIDDEN_TEXT = (
    "403 Forbidden: this site is behind Cloudflare Access and the request carried no valid "
    "Access token. Open it through its Access URL (sign in again if your session expired).\n"
)


def access_check(request: HttpRequest) -> HttpResponse | None:
    """With Access on, the 403 for a request without a valid token (the reason logged), or None
    with request.user set to the token's user; None at once with Access off or on /healthz.
    The middleware below and the static files handler (pokosite/cloudflare_access/static.py)
    both ask it."""
    request.cf_access_identity = None
    config = access_config()
    if config is None or request.path_info == OPEN_PATH:
        return None
    token = token_pick(request.headers.get(HEADER_NAME), request.COOKIES.get(COOKIE_NAME))
    try:
        user, identity = access_authenticate(config=config, token=token, path=request.path_info)
    except AccessDenied as denied:
        refusal_log(
            protocol=request.method or "HTTP",
            path=request.path_info,
            client=request.META.get("REMOTE_ADDR", "?"),
            reason=denied.reason,
        )
        return HttpResponseForbidden(FORBIDDEN_TEXT, content_type="text/plain")
    request.user = user
    request._cached_user = user  # what django.contrib.auth.get_user would have cached
    request.cf_access_identity = identity
    return None


class CloudflareAccessMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refused = access_check(request)
        if refused is not None:
            return refused
        return self.get_response(request)
