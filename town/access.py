"""Who may watch a run and who may control one: the one check the views and the WebSocket
consumer share. Cloudflare Access (pokosite) verifies identity before either is reached; this
decides what a known (or, locally, anonymous) user may do.

settings.TOWN_VIEW_LOGIN_REQUIRED (default False: anyone who reaches the site may watch, as
with `make run` on 127.0.0.1) makes watching need a logged-in user. Controls — the run pages'
buttons, and the API's creating, starting, pausing, stepping and stopping runs and asking for
decisions (town/api/permissions.py) — are staff only. A Cloudflare Access service token (the
user `service-token:<client id>`) controls only when settings.CONTROL_SERVICE_TOKENS lists its
client id.
"""

from __future__ import annotations

from django.conf import settings

from pokosite.cloudflare_access.users import SERVICE_USERNAME_PREFIX


def can_watch_runs(user) -> bool:
    if getattr(settings, "TOWN_VIEW_LOGIN_REQUIRED", False):
        return bool(user is not None and user.is_authenticated and user.is_active)
    return True


def can_control_runs(user) -> bool:
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    if user.get_username().startswith(SERVICE_USERNAME_PREFIX):
        client_id = user.get_username().removeprefix(SERVICE_USERNAME_PREFIX)
        return client_id in getattr(settings, "CONTROL_SERVICE_TOKENS", [])
    return bool(user.is_staff)
