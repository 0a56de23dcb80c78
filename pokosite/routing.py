"""WebSocket URL routes, mounted by pokosite/asgi.py. The town view adds its consumer here."""

from __future__ import annotations

from django.urls import URLPattern

from town.routing import websocket_urlpatterns as town_websocket_urlpatterns

websocket_urlpatterns: list[URLPattern] = [*town_websocket_urlpatterns]
