"""The tick loop: one tick fans out one decision per resident, at most `concurrency` in flight,
waits for the answers (or the run's decision timeout), then applies them in resident order. A
decision no worker has begun within settings.TOWN_DECISION_RESEND_S is sent again (its message
may be lost: services/decisions.py says how). A decision whose node is down (no heartbeat for
settings.INFERENCE_NODE_DOWN_S) while another of the run's nodes is up goes to that one instead,
queued or running: the tick does not wait for the dead node.

Before a tick's decisions are sent, its distinct schemas are compiled on their nodes (the send's
`warm_schemas`), so the decisions find them compiled. Decisions go to the nodes' Celery queues
(`tasks.decision_send`). `InlineSend` computes them in this process instead, on threads sharing
this process's engine — the same service, for `run_town --inline` and for tests without a worker.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from inference.fleet.health import NodeState, node_states
from inference.fleet.task_queue import TaskQueueUnavailable
from inference.services import completion_schemas_warm
from town import services
from town.models import Decision, Run, Tick
from town.selectors import runs_due, tick_decisions
from town.services.decisions import ANSWERED, IN_FLIGHT, DecisionSend
from town.services.routes import decision_node_replacement

logger = logging.getLogger(__name__)

D = Decision.Status
LEASE_S = 60.0

Progress = Callable[[int], None]  # called with the number of decisions newly answered


def lease_owner_name(kind: str) -> str:
    return f"{kind}:{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


class InlineSend:
    """Computes decisions on a thread pool in this process (its engine is this process's)."""

    def __init__(self, max_workers: int = 4) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="decision")

    def __call__(self, decision_id: int, node: str, send: int) -> None:
        self._pool.submit(self._compute, decision_id, send)

    @staticmethod
    def _compute(decision_id: int, send: int) -> None:
        try:
            services.decision_compute(
                decision_id=decision_id, worker=f"inline:{os.getpid()}", send=send
            )
        except Exception as exc:
            logger.exception("decision %s failed inline", decision_id)
            services.decision_fail(
                decision_id=decision_id, error=f"{type(exc).__name__}: {exc}", send=send
            )
        finally:
            connection.close()

    @staticmethod
    def warm_schemas(node_to_schemas: dict[str, list[dict]]) -> None:
        """Compile the decisions' schemas on this process's engine (every node is this one)."""
        schemas = list({json.dumps(s): s for ss in node_to_schemas.values() for s in ss}.values())
        completion_schemas_warm(json_schemas=schemas)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _tick_schemas_warm(*, tick: Tick, send: DecisionSend) -> None:
    """Before a tick's decisions are sent: have each node compile the tick's distinct schemas
    (they differ only in which places are open and offered: a few per tick), each once and all
    at once, so no decision waits for a compile (a no-op for a send that cannot warm)."""
    warm = getattr(send, "warm_schemas", None)
    if warm is None:
        return
    node_to_schemas: dict[str, dict[str, dict]] = {}
    for decision in tick_decisions(tick=tick):
        if decision.status == D.PENDING and decision.json_schema is not None:
            schemas = node_to_schemas.setdefault(decision.node, {})
            schemas[json.dumps(decision.json_schema)] = decision.json_schema
    if not node_to_schemas:
        return
    started = time.perf_counter()
    try:
        warm({node: list(schemas.values()) for node, schemas in node_to_schemas.items()})
    except TaskQueueUnavailable as exc:  # the decisions' own sends will say so again
        logger.warning("tick %s: schemas not warmed: %s", tick.pk, exc)
        return
    logger.info(
        "tick %s: %s distinct schemas warmed on %s node(s) in %.2f s",
        tick.pk,
        sum(len(s) for s in node_to_schemas.values()),
        len(node_to_schemas),
        time.perf_counter() - started,
    )


def _timed_out(decision: Decision, timeout_s: float) -> bool:
    if decision.dispatched_at is None:
        return False
    return (timezone.now() - decision.dispatched_at).total_seconds() > timeout_s


def _queue_down_logged(
    service: Callable[..., object], *, decision, send: DecisionSend, **kwargs: object
) -> None:
    """Send through `service`; with the task queue down, log it and let the next pass retry
    (dispatch leaves the decision pending, a resend leaves it due)."""
    try:
        service(decision=decision, send=send, **kwargs)
    except TaskQueueUnavailable as exc:
        logger.warning("decision %s not sent: %s", decision.pk, exc)


class _NodeHealth:
    """The run's nodes' states, read at most every HEALTH_READ_S: which node replaces a down
    one for a decision (services/routes.py), None while its own is up or none is."""

    HEALTH_READ_S = 0.5

    def __init__(self, *, run: Run) -> None:
        self._run = run
        self._states: list[NodeState] = []
        self._read_at = -float("inf")

    def replacement(self, decision: Decision) -> str | None:
        return decision_node_replacement(run=self._run, decision=decision, states=self._read())

    def state(self, node: str) -> NodeState | None:
        return next((s for s in self._read() if s.node == node), None)

    def _read(self) -> list[NodeState]:
        if time.monotonic() - self._read_at >= self.HEALTH_READ_S:
            self._states = node_states(self._run.nodes)
            self._read_at = time.monotonic()
        return self._states


def _resend_if_lost(
    *, decision: Decision, send: DecisionSend, health: _NodeHealth, told: set[tuple[int, int]]
) -> None:
    """A decision past its resend time: sent again (a WARNING) only when its message may be
    lost; one waiting behind others on a live node is left alone (INFO, once per send)."""
    verdict = services.decision_wait_verdict(decision=decision, state=health.state(decision.node))
    if verdict.resend:
        _queue_down_logged(services.decision_resend, decision=decision, send=send, why=verdict.why)
    elif (decision.pk, decision.num_sends) not in told:
        told.add((decision.pk, decision.num_sends))
        logger.info("decision %s %s; not sent again", decision.pk, verdict.why)


def _tick_decide(
    *,
    run: Run,
    tick: Tick,
    send: DecisionSend,
    poll_s: float,
    progress: Progress | None,
    renew: Callable[[], None],
) -> None:
    num_answered_seen = 0
    resend_s = settings.TOWN_DECISION_RESEND_S
    health = _NodeHealth(run=run)
    told: set[tuple[int, int]] = set()  # (decision, send) whose expected wait was logged
    while True:
        decisions = tick_decisions(tick=tick)
        in_flight = [d for d in decisions if d.status in IN_FLIGHT]
        for decision in in_flight:
            replacement = health.replacement(decision)
            if _timed_out(decision, run.decision_timeout_s):
                logger.warning("decision %s timed out on node %s", decision.pk, decision.node)
                services.decision_time_out(decision=decision)
            elif replacement is not None:
                _queue_down_logged(
                    services.decision_reroute, decision=decision, send=send, node=replacement
                )
            elif services.decision_resend_due(decision=decision, resend_s=resend_s):
                _resend_if_lost(decision=decision, send=send, health=health, told=told)
        waiting = [d for d in decisions if d.status == D.PENDING]
        for decision in waiting[: max(0, run.concurrency - len(in_flight))]:
            # Routed when the tick began; a node gone down since then gets none.
            decision.node = health.replacement(decision) or decision.node
            _queue_down_logged(services.decision_dispatch, decision=decision, send=send)
        num_answered = sum(1 for d in decisions if d.status in ANSWERED)
        if progress is not None and num_answered > num_answered_seen:
            progress(num_answered - num_answered_seen)
        num_answered_seen = num_answered
        if num_answered == len(decisions) and not waiting:
            return
        renew()
        time.sleep(poll_s)


def tick_run(
    *,
    run_id: int,
    send: DecisionSend,
    owner: str,
    poll_s: float = 0.2,
    progress: Progress | None = None,
    before_decide: Callable[[Tick], None] | None = None,
) -> Tick | None:
    """Advance the run by one tick; None if another process holds the run's lease.

    `before_decide(tick)` runs once the tick's decisions exist, before any is sent (the
    experiment warms the tick's shared head there)."""
    run = Run.objects.get(pk=run_id)
    if not services.run_lease_take(run=run, owner=owner, seconds=LEASE_S):
        logger.info("run %s is advanced by another process; skipping it", run_id)
        return None

    def renew() -> None:
        services.run_lease_take(run=run, owner=owner, seconds=LEASE_S)

    tick = services.tick_begin(run=run)
    logger.info("run %s: tick %s (day %s %s)", run.pk, tick.index, tick.day, tick.phase)
    if before_decide is not None:
        before_decide(tick)
    _tick_schemas_warm(tick=tick, send=send)
    _tick_decide(run=run, tick=tick, send=send, poll_s=poll_s, progress=progress, renew=renew)
    return services.tick_finish(tick=tick)


def loop_forever(*, send: DecisionSend, idle_s: float = 1.0, poll_s: float = 0.2) -> None:
    """Advance every run that is due, tick by tick, until interrupted (`make run`'s tick loop)."""
    owner = lease_owner_name("tick_loop")
    while True:
        close_old_connections()
        runs = list(runs_due())
        if not runs:
            time.sleep(idle_s)
            continue
        for run in runs:
            try:
                tick_run(run_id=run.pk, send=send, owner=owner, poll_s=poll_s)
            except Exception:
                # One broken run must not stop the town: log it and come back to it later.
                logger.exception("run %s: the tick failed; retrying after %s s", run.pk, idle_s)
                time.sleep(idle_s)
            finally:
                services.run_lease_release(run=run, owner=owner)
