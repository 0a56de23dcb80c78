"""The admin's node page: every configured node, up or down, its load, KV usage and the prefixes
it reports (inference/fleet/health.py). An interface only: it reads the states and shows them."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from inference.fleet.health import node_states
from inference.fleet.nodes import node_names


def nodes_view(request: HttpRequest) -> HttpResponse:
    context = {
        **admin.site.each_context(request),
        "title": "Inference nodes",
        "states": node_states(node_names()),
        "down_s": settings.INFERENCE_NODE_DOWN_S,
        "interval_s": settings.INFERENCE_HEARTBEAT_INTERVAL_S,
        "policy": settings.INFERENCE_ROUTING_POLICY,
        "balance_abs": settings.INFERENCE_ROUTING_BALANCE_ABS,
        "balance_rel": settings.INFERENCE_ROUTING_BALANCE_REL,
    }
    return TemplateResponse(request, "admin/inference/nodes.html", context)
