"""A node worker's lifecycle: load the engine when the worker starts, publish its live stats
(inference/completions/engine_stats.py) and its node's heartbeat (inference/fleet/health.py) while
it runs, stop them all when it stops.

Connected in InferenceConfig.ready(); the signals fire only inside `celery worker` processes.
The warm-up runs before the worker logs "ready.", so a ready worker can serve at once. With an
external OpenAI-compatible server configured, the worker loads no engine at all.
"""

from __future__ import annotations

import logging

from celery.exceptions import WorkerShutdown
from celery.signals import worker_ready, worker_shutdown
from django.conf import settings

from inference.completions.engine_stats import StatsPublisher
from inference.completions.remote import remote_is_configured
from inference.completions.runtime import engine_get, engine_shutdown
from inference.fleet.health import HeartbeatPublisher

logger = logging.getLogger(__name__)

_publishers: list[StatsPublisher | HeartbeatPublisher] = []


def _pool_forks(consumer: object) -> bool:
    pool_cls = getattr(getattr(consumer, "controller", None), "pool_cls", None)
    return "prefork" in getattr(pool_cls, "__module__", "")


def engine_warm_up(sender: object = None, **_: object) -> None:
    if remote_is_configured():
        logger.info(
            "completions go to %s (model %s); this worker loads no engine",
            settings.INFERENCE_OPENAI["base_url"],
            settings.INFERENCE_OPENAI["model"],
        )
        return
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
        # Its compile workers too (each imports xgrammar: seconds), so the first decisions
        # do not wait for them (a task running past the visibility timeout is redelivered).
        engine = engine_get()
        engine.structured.start_workers(engine.config.structured_output.grammar_compile_workers)
    except Exception as exc:
        logger.exception("the engine failed to load; stopping this worker")
        raise WorkerShutdown(f"engine failed to load: {exc}") from exc


def stats_publish_start(sender: object = None, **_: object) -> None:
    """Publish the engine's stats under the worker's name (e.g. spark-a@gpu1) once it is loaded."""
    if remote_is_configured():
        return
    name = getattr(sender, "hostname", None) or "worker"
    _publishers.append(StatsPublisher(name).start())


def worker_nodes(consumer: object) -> list[str]:
    """The nodes this worker serves: the queues it consumes (`-Q spark-a`), which are named after
    their nodes (inference/fleet/nodes.py)."""
    app = getattr(consumer, "app", None)
    try:
        queues = list(app.amqp.queues.consume_from) if app is not None else []
    except AttributeError:
        queues = []
    return sorted(queues)


def heartbeat_start(sender: object = None, **_: object) -> None:
    """Say, every few seconds, that this worker's nodes are up, how loaded, holding what."""
    nodes = worker_nodes(sender)
    if not nodes:
        logger.warning("this worker consumes no queue: no node heartbeat is sent")
        return
    name = getattr(sender, "hostname", None) or "worker"
    _publishers.append(HeartbeatPublisher(nodes=nodes, worker=name).start())
    logger.info("node heartbeat: %s up as %s", ", ".join(nodes), name)


def engine_stop(**_: object) -> None:
    while _publishers:
        _publishers.pop().stop()
    engine_shutdown()


def worker_signals_connect() -> None:
    worker_ready.connect(engine_warm_up, weak=False, dispatch_uid="inference.engine_warm_up")
    worker_ready.connect(
        stats_publish_start, weak=False, dispatch_uid="inference.stats_publish_start"
    )
    # After the warm-up (connected later, so called later): a node is up once it can serve.
    worker_ready.connect(heartbeat_start, weak=False, dispatch_uid="inference.heartbeat_start")
    worker_shutdown.connect(engine_stop, weak=False, dispatch_uid="inference.engine_stop")
