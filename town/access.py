"""Who may watch a run and who may control one: the one check the views and the WebSocket
consumer share. Cloudflare Access (pokosite) verifies identity before either is reached; this
decides what a known (or, locally, anonymous) user may do.

settings.TOWN_VIEW_LOGIN_REQUIRED (default False: anyone who reaches the site may watch, as
with `make run` on 127.0.0.1) makes watching need a logged-in user. Controls are staff only.
"""

from __future__ import annotations

from django.conf import settings


def can_watch_runs(user) -> bool:
    if getattr(settings, "TOWN_VIEW_LOGIN_REQUIRED", False):
        return bool(user is not None and user.is_authenticated and user.is_active)
    return True


def can_control_runs(user) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)
