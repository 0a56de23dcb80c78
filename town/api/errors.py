"""How the API answers errors: unknown ids 404, bad input 400 with field messages, a run in the
wrong state 409, the task queue down 503. The town's own errors become those answers here, so
views just call services.
"""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from inference.fleet.task_queue import TaskQueueUnavailable
from town.errors import RunStateError, TownError


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, RunStateError):
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, TownError):
        return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, TaskQueueUnavailable):
        return Response({"detail": str(exc)}, status=status.HTTP_503_SERVICE_UNAVAILABLE)
    return drf_exception_handler(exc, context)


class TownApiErrorsMixin:
    """Viewsets that answer town errors as 400/409 (without changing the project's DRF settings)."""

    def get_exception_handler(self):
        return api_exception_handler
