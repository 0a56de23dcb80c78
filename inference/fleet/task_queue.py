"""Sending a Celery task, failing fast when the task queue (Redis) is down.

Celery's defaults retry a publish for ~20 s and the Redis result backend reconnects 20 times
before it gives up; a web request waiting that long looks hung. The settings bound both
(CELERY_TASK_PUBLISH_RETRY_POLICY, CELERY_REDIS_SOCKET_CONNECT_TIMEOUT,
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS in pokosite/settings/base.py) and `task_send` turns
what the send then raises into one error that says what is down.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
from celery import Task
from celery.result import AsyncResult
from django.conf import settings
from kombu.exceptions import OperationalError


class TaskQueueUnavailable(Exception):
    """The task queue could not take the task: nothing was sent."""


def queue_address() -> str:
    """Where the broker is, without its password."""
    parts = urlsplit(settings.CELERY_BROKER_URL)
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}"


def task_send(task: Task, *, args: list[Any], queue: str, **options: Any) -> AsyncResult:
    try:
        return task.apply_async(args=args, queue=queue, **options)
    except (OperationalError, redis.RedisError, OSError) as exc:
        raise TaskQueueUnavailable(_message(exc)) from exc
    except RuntimeError as exc:
        # The Redis result backend's "Retry limit exceeded while trying to reconnect".
        if "result store" not in str(exc):
            raise
        raise TaskQueueUnavailable(_message(exc)) from exc


def _message(exc: BaseException) -> str:
    why = " ".join(str(exc).split()) or type(exc).__name__
    return (
        f"the task queue (Redis at {queue_address()}) is not reachable, so nothing was sent: "
        f"{why[:200]}; retry once it is back"
    )
