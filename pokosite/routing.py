"""WebSocket URL routes, mounted by pokosite/asgi.py. The town view adds its consumer here.

A path no route matches (e.g. /ws/runs/<24 digits>/, past the id converter's 18) is closed
with 4404 by `NoRouteConsumer`, the last route: Channels' URLRouter would raise instead, which
daphne logs as a 500 with a traceback.
"""

from __future__ import annotations

import logging

from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import URLPattern, re_path

from town.routing import websocket_urlpatterns as town_websocket_urlpatterns

logger = logging.getLogger(__name__)

NO_ROUTE_CLOSE_CODE = 4404


class NoRouteConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        logger.info("WebSocket to %s refused: no such route", self.scope.get("path"))
        await self.close(code=NO_ROUTE_CLOSE_CODE)


websocket_urlpatterns: list[URLPattern] = [
    *town_websocket_urlpatterns,
    re_path(r"", NoRouteConsumer.as_asgi()),
]
