"""The town's WebSocket routes (mounted by pokosite/routing.py)."""

from __future__ import annotations

from django.urls import path

from town.consumers import RunConsumer

websocket_urlpatterns = [
    path("ws/runs/<int:run_id>/", RunConsumer.as_asgi()),
]
