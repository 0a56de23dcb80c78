"""Who a request is when Cloudflare Access is off: a DRF token in the Authorization header
(`Bearer <key>` or `Token <key>`) is its user. And production without Access
(POKOMACHI_INSECURE_RUN_WITHOUT_ACCESS=true): nothing is
open but the health check and the login page. Pages redirect to the admin login; /v1 answers 401
in OpenAI's shape, /api/ in DRF's, /metrics in plain text. Machine clients send a DRF token
(`manage.py drf_create_token <user>`) as `Authorization: Bearer <key>` or `Token <key>`.

Refuses nothing when LOGIN_REQUIRED_WITHOUT_ACCESS is False; does nothing when Access is on: then
the Access middleware before this one has already refused every request without a valid token.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, JsonResponse

from pokosite.cloudflare_access.config import access_config
from pokosite.cloudflare_access.gate import OPEN_PATH

LOGIN_PATH = "/admin/login/"
# The login page's own stylesheets live under /static/; the login page must render (with the
# favicon a browser asks for).
OPEN_PREFIXES = (LOGIN_PATH, "/static/", "/favicon.ico")
TOKEN_SCHEMES = ("bearer", "token")


def header_token_user(request: HttpRequest):
    """The active user whose DRF token the Authorization header carries, or None."""
    from rest_framework.authtoken.models import Token

    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() not in TOKEN_SCHEMES or not key.strip():
        return None
    token = Token.objects.select_related("user").filter(key=key.strip()).first()
    if token is None or not token.user.is_active:
        return None
    return token.user


def _refusal(request: HttpRequest) -> HttpResponse:
    message = (
        "login required: this site runs without Cloudflare Access, so every request needs a "
        "logged-in user (sign in at /admin/login/) or a token (Authorization: Bearer <key>)"
    )
    path = request.path_info
    if path.startswith("/v1/"):
        error = {"message": message, "type": "authentication_error", "param": None, "code": None}
        return JsonResponse({"error": error}, status=401)
    if path.startswith("/api/"):
        return JsonResponse({"detail": message}, status=401)
    if path == "/metrics":
        return HttpResponse(message + "\n", status=401, content_type="text/plain")
    return redirect_to_login(request.get_full_path(), LOGIN_PATH)


class LoginRequiredMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if access_config() is not None:
            return self.get_response(request)  # the Access middleware decided who this is
        if "Authorization" in request.headers and not request.user.is_authenticated:
            # A machine client's DRF token (the OpenAI clients' api_key): its own identity for
            # the API and for /v1's cache salt (inference/completions/cache_salt.py).
            user = header_token_user(request)
            if user is not None:
                request.user = request._cached_user = user
        if not getattr(settings, "LOGIN_REQUIRED_WITHOUT_ACCESS", False):
            return self.get_response(request)
        path = request.path_info
        if path == OPEN_PATH or path.startswith(OPEN_PREFIXES):
            return self.get_response(request)
        if not request.user.is_authenticated:
            return _refusal(request)
        return self.get_response(request)
