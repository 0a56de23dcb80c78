"""The town's WebSocket routes (mounted by pokosite/routing.py)."""

from __future__ import annotations

from django.urls import path

from town import converters
from town.consumers import RunConsumer

converters.register()

websocket_urlpatterns = [
    path("ws/runs/<id:run_id>/", RunConsumer.as_asgi()),
]
