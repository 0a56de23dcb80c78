"""DRF authentication: from the Access identity the middleware verified, and from DRF tokens.

A person's browser sends the CF_Authorization cookie on its own, cross-site requests included,
so their unsafe requests still need Django's CSRF token, as with session auth. A service token is
a machine client sending its own credentials (CF-Access-Client-Id/Secret) and has no CSRF token:
it is not asked for one. Nor is a DRF token (`Authorization: Token <key>`): see
HeaderTokenAuthentication.
"""

from __future__ import annotations

from rest_framework.authentication import (
    SessionAuthentication,
    TokenAuthentication,
    get_authorization_header,
)
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from pokosite.cloudflare_access.login_required import TOKEN_SCHEMES


class CloudflareAccessAuthentication(SessionAuthentication):
    def authenticate(self, request: Request):
        identity = getattr(request._request, "cf_access_identity", None)
        if identity is None:
            return None  # Access is off (or this is /healthz): the next class decides
        if not identity.is_service:
            self.enforce_csrf(request)
        return request._request.user, identity


class HeaderTokenAuthentication(TokenAuthentication):
    """A DRF token (`manage.py drf_create_token <user>`) sent as `Authorization: Token <key>` or
    `Bearer <key>` (what OpenAI clients send), the two schemes LoginRequiredMiddleware reads.

    It must come before SessionAuthentication: that middleware has already made the token's user
    request.user, and session auth would take it from there and refuse the machine client's
    POST for want of a CSRF token."""

    def authenticate(self, request: Request):
        scheme, _, key = get_authorization_header(request).decode("latin-1").partition(" ")
        if scheme.lower() not in TOKEN_SCHEMES:
            return None
        if not key.strip() or " " in key.strip():
            raise AuthenticationFailed(
                "Invalid token header: send `Authorization: Token <key>`, one key without spaces"
            )
        return self.authenticate_credentials(key.strip())
