"""WebSocket URL routes, mounted by pokosite/asgi.py. The town view adds its consumer here."""

from __future__ import annotations

from django.urls import URLPattern

websocket_urlpatterns: list[URLPattern] = []
