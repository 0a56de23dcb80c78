"""DRF authentication from the Access identity the middleware verified.

A person's browser sends the CF_Authorization cookie on its own, cross-site requests included,
so their unsafe requests still need Django's CSRF token, as with session auth. A service token is
a machine client sending its own credentials (CF-Access-Client-Id/Secret) and has no CSRF token:
it is not asked for one.
"""

from __future__ import annotations

from rest_framework.authentication import SessionAuthentication
from rest_framework.request import Request


class CloudflareAccessAuthentication(SessionAuthentication):
    def authenticate(self, request: Request):
        identity = getattr(request._request, "cf_access_identity", None)
        if identity is None:
            return None  # Access is off (or this is /healthz): the next class decides
        if not identity.is_service:
            self.enforce_csrf(request)
        return request._request.user, identity
