"""Template context: whether Access guards this site, and who the request is.

    cf_access_enabled    bool
    cf_access_identity   the AccessIdentity of this request, or None

Pages include "cloudflare_access/notice.html" to say when the site runs without Access.
"""

from __future__ import annotations

from django.http import HttpRequest

from pokosite.cloudflare_access.config import access_is_enabled


def cloudflare_access(request: HttpRequest) -> dict:
    return {
        "cf_access_enabled": access_is_enabled(),
        "cf_access_identity": getattr(request, "cf_access_identity", None),
    }
