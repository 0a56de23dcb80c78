"""Decision services: dispatch to a node, compute on the engine (inside the node's worker), time
out, and apply to the town.

Computing stores the raw output and every metric and nothing else; parsing, checking and
applying happen in the tick, in resident order, so a tick's outcome does not depend on which
decision came back first.

Deliveries: a worker killed mid-decision leaves its message unacknowledged and the broker hands it
out again (same send); a worker killed after taking the message off the queue but before recording
it as unacknowledged loses it, so the tick loop sends a decision no worker has begun again
(`decision_resend`, send 2, 3, ...) — but only when the heartbeats do not explain the wait
(`decision_wait_verdict`): one queued behind others on a live node is waiting, not lost. Each
delivery says which send it is; only the send that began the running attempt may begin it again, so
two copies never compute at once, and an answer that comes after another one is dropped. A broker
also hands out a message again while its worker is still computing it (past the visibility timeout,
or one the worker had prefetched): a process never begins a decision it is computing already. A
decision whose node went down (no heartbeat: inference/fleet/health.py) is sent to a live node
instead (`decision_reroute`); the unique (tick, resident) row and the send that holds the running
attempt keep it to one answer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from inference.completions.cache_salt import run_cache_salt
from inference.errors import CompletionInputError, CompletionTimeoutError
from inference.fleet.health import NodeState
from inference.fleet.task_queue import TaskQueueUnavailable
from inference.services import Completion, CompletionRequest, completion_generate
from town import events
from town.models import Decision, Run
from town.rules.actions import action_problem
from town.rules.effects import Note, action_apply
from town.rules.world import World
from town.services.choices import decision_parse

logger = logging.getLogger(__name__)

D = Decision.Status
IN_FLIGHT = (D.QUEUED, D.RUNNING)
COMPUTABLE = (D.PENDING, D.QUEUED, D.RUNNING)
ANSWERED = (D.COMPUTED, D.FAILED, D.TIMED_OUT)

# (decision id, node, send number) → puts the decision on the node's way
DecisionSend = Callable[[int, str, int], None]


def _send_on_commit(decision: Decision, send: DecisionSend) -> None:
    decision_id, node, number = decision.pk, decision.node, decision.num_sends
    transaction.on_commit(lambda: send(decision_id, node, number))


def decision_dispatch(
    *, decision: Decision, send: DecisionSend, priority: int | None = None
) -> Decision:
    """Mark the decision queued (the resident is thinking: an event says so) and send it once
    the transaction commits. When the task queue is down (TaskQueueUnavailable, raised), the
    decision is pending again, never left queued with no message: a later dispatch sends it.
    `priority`: the engine's scheduling class; None, the tick loop's (a setting)."""
    try:
        with transaction.atomic():
            decision.status = D.QUEUED
            decision.dispatched_at = timezone.now()
            decision.num_sends = 1
            decision.priority = settings.INFERENCE_PRIORITY_TICK if priority is None else priority
            decision.save(
                update_fields=["status", "dispatched_at", "num_sends", "node", "priority"]
            )
            # Registered before the event's broadcast, so the view never delays the decision.
            _send_on_commit(decision, send)
            events.decision_started_emit(decision=decision, tick_index=decision.tick.index)
    except TaskQueueUnavailable:
        Decision.objects.filter(pk=decision.pk, status=D.QUEUED, num_sends=1).update(
            status=D.PENDING, dispatched_at=None, num_sends=0
        )
        decision.status, decision.dispatched_at, decision.num_sends = D.PENDING, None, 0
        raise
    return decision


def decision_resend_due(*, decision: Decision, resend_s: float) -> bool:
    """Queued, and no worker has begun it within resend_s of its last send."""
    if decision.status != D.QUEUED or decision.dispatched_at is None:
        return False
    waited_s = (timezone.now() - decision.dispatched_at).total_seconds()
    return waited_s > max(decision.num_sends, 1) * resend_s


@dataclass(frozen=True, slots=True)
class WaitVerdict:
    """Whether a queued decision no worker began should be sent again, and why."""

    resend: bool
    why: str


def decision_wait_verdict(*, decision: Decision, state: NodeState | None) -> WaitVerdict:
    """For a decision past its resend time (decision_resend_due): wait on, when its node's
    heartbeats say the node is alive and has work queued that it can be waiting behind; send it
    again when a worker of the node went silent since it was sent, when the live node reports
    nothing queued or taken (the message is lost), or when no heartbeat says anything."""
    node = decision.node
    waited_s = (timezone.now() - decision.dispatched_at).total_seconds()
    if state is None or not state.is_up:
        return WaitVerdict(
            True,
            f"no worker began it within {waited_s:.0f} s and no heartbeat says node "
            f"{node} is alive",
        )
    # A worker that died after the send may have taken the message with it (it was alive then:
    # its last heartbeat came within one interval of the send, or later).
    sent_at = decision.dispatched_at.timestamp() - settings.INFERENCE_HEARTBEAT_INTERVAL_S
    gone = [worker for worker, last in state.silent_workers if last >= sent_at]
    if gone:
        return WaitVerdict(True, f"worker {gone[0]} of node {node} went silent after it was sent")
    if state.num_queued + state.num_reserved > 0:
        return WaitVerdict(
            False,
            f"waits behind the work of live node {node} ({state.num_running} running, "
            f"{state.num_queued} queued, {state.num_reserved} taken and not begun)",
        )
    return WaitVerdict(
        True,
        f"no worker began it within {waited_s:.0f} s and live node {node} reports nothing "
        "queued or taken: its message is lost",
    )


def decision_resend(*, decision: Decision, send: DecisionSend, why: str = "") -> bool:
    """Send a queued decision again (its message may be lost); False if a worker began it or
    someone resent it meanwhile. `why` goes in the warning."""
    with transaction.atomic():
        updated = Decision.objects.filter(
            pk=decision.pk, status=D.QUEUED, num_sends=decision.num_sends
        ).update(num_sends=F("num_sends") + 1)
        if not updated:
            return False
        decision.num_sends += 1
        _send_on_commit(decision, send)
    logger.warning(
        "decision %s: %s; sent again (send %s)",
        decision.pk,
        why or f"no worker began it on node {decision.node}",
        decision.num_sends,
    )
    return True


def decision_reroute(*, decision: Decision, node: str, send: DecisionSend) -> bool:
    """Send an in-flight decision whose node is down to `node`, a live one (send n+1); False if
    it was answered, resent or rerouted meanwhile.

    It is queued again with no running send, so the new send may begin it even if a worker of
    the dead node had begun it. Should that worker still be alive after all (only silent), its
    answer is dropped (only the send that began the running attempt may answer), and a copy it
    begins first makes the new send's delivery drop out: one attempt at a time, one answer."""
    old_node = decision.node
    with transaction.atomic():
        updated = Decision.objects.filter(
            pk=decision.pk, status__in=IN_FLIGHT, num_sends=decision.num_sends, node=old_node
        ).update(node=node, status=D.QUEUED, started_send=None, num_sends=F("num_sends") + 1)
        if not updated:
            return False
        decision.node, decision.status, decision.started_send = node, D.QUEUED, None
        decision.num_sends += 1
        _send_on_commit(decision, send)
    logger.warning(
        "decision %s: node %s is down; sent to node %s (send %s)",
        decision.pk,
        old_node,
        node,
        decision.num_sends,
    )
    return True


def _decision_seed(decision: Decision) -> int | None:
    run = decision.run
    if run.temperature == 0:
        return None
    # The resident's place in the town, not its database id: the same seed gives the same
    # decisions in any database.
    resident = decision.resident
    ordinal = resident.town.residents.filter(id__lt=resident.id).count()
    return (run.seed * 1_000_003 + decision.tick.index * 10_007 + ordinal) % 2**31


def _decision_begin(*, decision_id: int, worker: str, send: int) -> Decision | None:
    """Count the attempt; None if the decision is gone, answered, or being computed from
    another send."""
    with transaction.atomic():
        decision = Decision.objects.select_for_update().filter(pk=decision_id).first()
        if decision is None:
            logger.warning("decision %s no longer exists; dropping its task", decision_id)
            return None
        if decision.status not in COMPUTABLE:
            logger.info(
                "decision %s is %s already; dropping this delivery", decision_id, decision.status
            )
            return None
        if decision.status == D.RUNNING and decision.started_send not in (None, send):
            # Another send's delivery is computing it; should that worker die, the broker
            # hands that send's message back, so this copy is not needed.
            logger.info(
                "decision %s is running from send %s; dropping send %s",
                decision_id,
                decision.started_send,
                send,
            )
            return None
        decision.attempts += 1
        decision.retries = decision.attempts - 1
        decision.status = D.RUNNING
        decision.started_at = timezone.now()
        decision.worker = worker
        decision.started_send = send
        decision.save(
            update_fields=["attempts", "retries", "status", "started_at", "worker", "started_send"]
        )
    if decision.retries:
        logger.info("decision %s: attempt %s (retried)", decision_id, decision.attempts)
    return decision


def _metric_fields(completion: Completion) -> dict[str, Any]:
    """The Decision fields a completion fills: its output, its metrics in their own columns, and
    all of them as reported (`metrics`, the JSON the admin and the API show)."""
    m = completion.metrics
    return {
        "raw_output": completion.text,
        "output_token_ids": list(completion.token_ids),
        "finish_reason": completion.finish_reason,
        "num_prompt_tokens": m.num_prompt_tokens,
        "num_cached_tokens": m.num_cached_tokens,
        "num_output_tokens": m.num_output_tokens,
        "lost_tokens": dict(m.lost_tokens),
        "queue_s": m.queue_s,
        "prefill_s": m.prefill_s,
        "decode_s": m.decode_s,
        "ttft_s": m.ttft_s,
        "engine_e2e_s": m.e2e_s,
        "metrics": m.to_json(),
    }


def _decision_answer(
    *, decision: Decision, status: str, send: int | None = None, **fields: Any
) -> bool:
    """Store the answer if nobody answered first (a twin delivery, the tick's timeout). With
    `send` (a worker's answer), only if that send holds the running attempt or none does: a
    decision rerouted away from a node that fell silent is not answered from there."""
    now = timezone.now()
    app_e2e_s = (now - decision.dispatched_at).total_seconds() if decision.dispatched_at else None
    still_ours = Q() if send is None else Q(started_send=send) | Q(started_send__isnull=True)
    with transaction.atomic():
        # The run's row first, as tick_finish takes it before it writes the decisions: the
        # event below needs it, and taking it after the decision's row could deadlock.
        Run.objects.select_for_update().filter(pk=decision.run_id).values_list("pk").get()
        stored = Decision.objects.filter(still_ours, pk=decision.pk, status__in=COMPUTABLE).update(
            status=status, computed_at=now, app_e2e_s=app_e2e_s, **fields
        )
        if stored:
            # The map and the feed show the answer now, not when the whole tick is applied.
            events.decision_answered_emit(decision_id=decision.pk)
    if not stored:
        logger.info("decision %s was answered already; this answer is dropped", decision.pk)
    return stored == 1


_computing_here: set[int] = set()
_computing_here_lock = threading.Lock()


@contextmanager
def _claim_in_this_process(decision_id: int) -> Iterator[bool]:
    """True while no other thread of this process computes the decision. A copy of the message
    that is being computed here (the broker restored it past the visibility timeout, or this
    worker had prefetched it twice) must not begin it again: this worker is alive, and its answer
    is coming. The database cannot tell that copy from one whose worker died."""
    with _computing_here_lock:
        claimed = decision_id not in _computing_here
        _computing_here.add(decision_id)
    try:
        yield claimed
    finally:
        if claimed:
            with _computing_here_lock:
                _computing_here.discard(decision_id)


def decision_cache_salt(run) -> str:
    """Runs never share cached prefixes, so each run's numbers are its own; and no /v1 caller
    can reach a run's cache (inference/completions/cache_salt.py)."""
    return run_cache_salt(run.pk)


def decision_completion_request(
    *, decision: Decision, run: Run, seed: int | None
) -> CompletionRequest:
    """What the decision asks inference: its prompt and schema, the run's sampling, and the
    resident as its affinity key (routing keeps a resident on its node: services/routes.py).
    CompletionInputError if the stored prompt is not one."""
    return CompletionRequest(
        messages=decision.messages,
        json_schema=decision.json_schema,
        max_tokens=run.max_tokens,
        temperature=run.temperature,
        seed=seed,
        # Runs do not share cached prefixes, so each run's numbers are its own.
        cache_salt=decision_cache_salt(run),
        priority=(
            settings.INFERENCE_PRIORITY_TICK if decision.priority is None else decision.priority
        ),
        affinity_key=f"resident:{decision.resident_id}",
    )


def decision_compute(*, decision_id: int, worker: str = "", send: int = 1) -> bool:
    """Run the decision's prompt on this process's engine and store output and metrics.

    `send`: which send of the decision this delivery is. True if this call stored the answer.
    Engine errors other than bad input propagate, so the Celery task can retry them. The run's
    decision_timeout_s (from dispatch) is the engine's deadline: past it the tick has given up
    on the decision, so the engine aborts the request and the decision is timed out.
    """
    with _claim_in_this_process(decision_id) as claimed:
        if not claimed:
            logger.info("decision %s is computing in this process; copy dropped", decision_id)
            return False
        return _decision_compute_claimed(decision_id=decision_id, worker=worker, send=send)


def _decision_compute_claimed(*, decision_id: int, worker: str, send: int) -> bool:
    decision = _decision_begin(decision_id=decision_id, worker=worker, send=send)
    if decision is None:
        return False
    try:
        request = decision_completion_request(
            decision=decision, run=decision.run, seed=_decision_seed(decision)
        )
        completion = completion_generate(request=request, timeout_s=_decision_time_left(decision))
    except CompletionInputError as exc:
        return _decision_answer(
            decision=decision, status=D.FAILED, send=send, error=f"engine refused: {exc}"
        )
    except CompletionTimeoutError as exc:
        return _decision_answer(decision=decision, status=D.TIMED_OUT, send=send, error=str(exc))
    return _decision_answer(
        decision=decision, status=D.COMPUTED, send=send, **_metric_fields(completion)
    )


def _decision_time_left(decision: Decision) -> float:
    """Seconds until the tick gives up on the decision (at least a little: a late delivery is
    still tried briefly rather than refused unseen)."""
    timeout_s = decision.run.decision_timeout_s
    if decision.dispatched_at is not None:
        timeout_s -= (timezone.now() - decision.dispatched_at).total_seconds()
    return max(timeout_s, 1.0)


def decision_fail(*, decision_id: int, error: str, send: int | None = None) -> bool:
    """Give up on a decision (its task kept failing); the resident will stay put. With `send`,
    only if that send still holds the running attempt (see _decision_answer)."""
    decision = Decision.objects.filter(pk=decision_id).first()
    if decision is None:
        return False
    return _decision_answer(decision=decision, status=D.FAILED, send=send, error=error)


def decision_time_out(*, decision: Decision) -> bool:
    return _decision_answer(
        decision=decision,
        status=D.TIMED_OUT,
        error=f"no answer within {decision.run.decision_timeout_s:g} s; the resident stays put",
    )


def decision_apply(*, world: World, decision: Decision) -> list[Note]:
    """Check the decision against the town as it is now and apply it; an impossible action is
    recorded on the decision and the resident stays put. Saves the decision."""
    resident = world.resident(decision.resident_id)
    value, error = decision_parse(decision=decision)
    notes: list[Note] = []
    if value is not None:
        decision.action, decision.target = value["action"], value["target"]
        decision.reason = value.get("reason", "")
        error = action_problem(world, resident, decision.action, decision.target) or ""
        if not error:
            notes = action_apply(world, resident, decision.action, decision.target, decision.reason)
    decision.valid = not error
    decision.error = error
    decision.status = D.APPLIED if decision.status == D.COMPUTED else decision.status
    decision.applied_at = timezone.now()
    if decision.dispatched_at is not None:
        decision.app_latency_s = (decision.applied_at - decision.dispatched_at).total_seconds()
    decision.save(
        update_fields=[
            "action",
            "target",
            "reason",
            "valid",
            "error",
            "status",
            "applied_at",
            "app_latency_s",
        ]
    )
    return notes
