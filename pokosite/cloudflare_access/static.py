"""Static files served by daphne itself (pokosite/asgi.py), behind Access like every page.

Django's ASGIStaticFilesHandler answers /static/ before the app, so no middleware sees those
requests: with Access on, the JS and CSS of the town view would be served to anyone. This
handler asks the same check as CloudflareAccessMiddleware (access_check) first.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.http import HttpRequest, HttpResponse

from pokosite.cloudflare_access.middleware import access_check


class AccessStaticFilesHandler(ASGIStaticFilesHandler):
    async def get_response_async(self, request: HttpRequest) -> HttpResponse:
        # A thread: the check may fetch the team's keys and look the user up.
        refused = await sync_to_async(access_check, thread_sensitive=False)(request)
        if refused is not None:
            return refused
        return await super().get_response_async(request)
