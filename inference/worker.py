"""A node worker's lifecycle: load the engine when the worker starts, stop it when it stops.

Connected in InferenceConfig.ready(); the signals fire only inside `celery worker` processes.
The warm-up runs before the worker logs "ready.", so a ready worker can serve at once.
"""

from __future__ import annotations

import logging

from celery.exceptions import WorkerShutdown
from celery.signals import worker_ready, worker_shutdown
from django.conf import settings

from inference.runtime import engine_get, engine_shutdown

logger = logging.getLogger(__name__)


def _pool_forks(consumer: object) -> bool:
    pool_cls = getattr(getattr(consumer, "controller", None), "pool_cls", None)
    return "prefork" in getattr(pool_cls, "__module__", "")


def engine_warm_up(sender: object = None, **_: object) -> None:
    if not settings.INFERENCE_ENGINE_WARMUP:
        return
    if _pool_forks(sender):
        # An engine built before fork would be shared, threads and all, by every child.
        logger.warning(
            "not warming the engine: this worker forks (prefork pool); "
            "run node workers with --pool threads so their threads share one engine"
        )
        return
    try:
        engine_get()
    except Exception as exc:
        logger.exception("the engine failed to load; stopping this worker")
        raise WorkerShutdown(f"engine failed to load: {exc}") from exc


def engine_stop(**_: object) -> None:
    engine_shutdown()


def worker_signals_connect() -> None:
    worker_ready.connect(engine_warm_up, weak=False, dispatch_uid="inference.engine_warm_up")
    worker_shutdown.connect(engine_stop, weak=False, dispatch_uid="inference.engine_stop")
