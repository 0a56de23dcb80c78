"""Celery tasks of the town: one decision, computed on the engine of the node whose queue it
was sent to. An interface only: it takes an id and calls one service.

acks_late: the message is acknowledged after the task ran, so a worker killed mid-decision
leaves it unacknowledged and the broker hands it out again (after the visibility timeout); the
Decision counts the attempt as a retry. Other failures are retried twice, then recorded.

Time: the run's decision_timeout_s is the engine's deadline (decision_compute aborts the
request past it). SOFT_TIME_LIMIT_S / TIME_LIMIT_S are a backstop above any run's timeout,
enforced by prefork pools only (node workers run `--pool threads`, which ignores them); a soft
limit that fires fails the decision with a clear error instead of retrying it.
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from inference.fleet.nodes import node_queue
from inference.fleet.task_queue import task_send
from inference.tasks import schemas_warm_on_nodes
from town.services import decision_compute as decision_compute_service
from town.services import decision_fail

logger = logging.getLogger(__name__)

MAX_RETRIES = 2
SOFT_TIME_LIMIT_S = 3 * 3600
TIME_LIMIT_S = SOFT_TIME_LIMIT_S + 60


@shared_task(
    bind=True,
    name="town.decision_compute",
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=MAX_RETRIES,
    soft_time_limit=SOFT_TIME_LIMIT_S,
    time_limit=TIME_LIMIT_S,
)
def decision_compute(self, decision_id: int, send: int = 1) -> bool:
    try:
        return decision_compute_service(
            decision_id=decision_id, worker=self.request.hostname or "", send=send
        )
    except SoftTimeLimitExceeded:
        error = f"the decision ran past the task's soft time limit ({SOFT_TIME_LIMIT_S} s)"
        logger.error("decision %s: %s", decision_id, error)
        decision_fail(decision_id=decision_id, error=error, send=send)
        return False
    except Exception as exc:
        if self.request.retries >= MAX_RETRIES:
            logger.exception("decision %s failed %s times; giving up", decision_id, MAX_RETRIES + 1)
            decision_fail(decision_id=decision_id, error=f"{type(exc).__name__}: {exc}", send=send)
            return False
        logger.warning("decision %s failed (%s); retrying", decision_id, exc)
        raise self.retry(exc=exc, countdown=1) from exc


class CelerySend:
    """The DecisionSend the tick loop uses: decisions go to their nodes' queues."""

    def __call__(self, decision_id: int, node: str, send: int) -> None:
        """Put a decision on its node's queue; `send` says which send of it this is
        (services/decisions.py: decision_resend)."""
        task_send(decision_compute, args=[decision_id, send], queue=node_queue(node))

    @staticmethod
    def warm_schemas(node_to_schemas: dict[str, list[dict]]) -> None:
        """Have each node compile its decisions' schemas, before they are sent (bounded by
        settings.TOWN_SCHEMA_WARM_S)."""
        schemas_warm_on_nodes(
            node_to_schemas=node_to_schemas, timeout_s=settings.TOWN_SCHEMA_WARM_S
        )


decision_send = CelerySend()
