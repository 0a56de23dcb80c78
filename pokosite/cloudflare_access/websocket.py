"""Channels middleware: with Access on, a WebSocket connect without a valid Access JWT (header
or CF_Authorization cookie) is closed before it is accepted (the browser sees 403); with one,
scope["user"] is the token's user and scope["cf_access_identity"] says who.

Wrap it inside AuthMiddlewareStack (so the token's user replaces the session's) and around the
URLRouter: pokosite/asgi.py does. Other scope types pass through untouched; Django's HTTP
middleware guards HTTP.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.security.websocket import WebsocketDenier
from django.http.cookie import parse_cookie

from pokosite.cloudflare_access.config import access_config
from pokosite.cloudflare_access.gate import access_authenticate, refusal_log
from pokosite.cloudflare_access.tokens import COOKIE_NAME, HEADER_NAME, AccessDenied, token_pick

_HEADER_KEY = HEADER_NAME.lower().encode("latin-1")


def _scope_token(scope: dict) -> str | None:
    header_value = None
    cookies: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        if name == _HEADER_KEY:
            header_value = value.decode("latin-1")
        elif name == b"cookie":
            cookies.update(parse_cookie(value.decode("latin-1")))
    return token_pick(header_value, cookies.get(COOKIE_NAME))


class CloudflareAccessWebSocketMiddleware:
    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return await self.inner(scope, receive, send)
        config = access_config()
        if config is None:
            return await self.inner(scope, receive, send)
        try:
            user, identity = await database_sync_to_async(access_authenticate)(
                config=config, token=_scope_token(scope), path=scope["path"]
            )
        except AccessDenied as denied:
            client = scope.get("client") or ("?",)
            refusal_log(
                protocol="WEBSOCKET",
                path=scope["path"],
                client=str(client[0]),
                reason=denied.reason,
            )
            return await WebsocketDenier.as_asgi()(scope, receive, send)
        scope = dict(scope, user=user, cf_access_identity=identity)
        return await self.inner(scope, receive, send)
