"""One resident's decision asked for on its own (the API's `POST /api/decisions/`).

The decision is the resident's Decision in the run's next tick: the tick is begun if it is not
open yet (one pending Decision per resident, as the tick loop would make them), and only this
resident's is sent to its node now, through the same Celery path. When the run is stepped or
resumed later, the tick loop picks the open tick up, sends the others, and applies them all in
resident order, this one included — so asking early changes nothing about the run's outcome.

Only a run nobody is advancing can be asked: created, paused (no step pending) or stopped.
"""

from __future__ import annotations

from django.conf import settings

from town.errors import RunStateError, TownError
from town.models import Decision, Resident, Run
from town.services.decisions import DecisionSend, decision_dispatch
from town.services.runs import run_lease_release, run_lease_take
from town.services.ticks import tick_begin

S = Run.Status
ASKABLE = (S.CREATED, S.PAUSED, S.STOPPED)
LEASE_S = 30.0


def _askable_check(run: Run) -> None:
    if run.status not in ASKABLE:
        raise RunStateError(
            f"cannot ask for a decision in run {run.pk}: it is {run.status}; "
            "ask in a created, paused or stopped run (pause a running one first)"
        )
    if run.num_steps_pending:
        raise RunStateError(
            f"cannot ask for a decision in run {run.pk}: a step is pending, so the tick loop "
            "is advancing it; ask again once the step is done"
        )


def decision_request(*, run: Run, resident: Resident, send: DecisionSend, owner: str) -> Decision:
    """Send `resident`'s decision in `run`'s next tick to its node now; returns it, queued.

    RunStateError when the run is being advanced or the decision was asked for already;
    TownError when the resident does not live in the run's town.
    """
    if resident.town_id != run.town_id:
        raise TownError(
            f"resident {resident.pk} ({resident.name}) lives in town {resident.town_id}, "
            f"not in run {run.pk}'s town {run.town_id}; pick a resident of that town"
        )
    _askable_check(run)
    if not run_lease_take(run=run, owner=owner, seconds=LEASE_S):
        raise RunStateError(
            f"run {run.pk} is being advanced by {run.lease_owner or 'another process'}; "
            "try again when its tick is done"
        )
    try:
        run.refresh_from_db()
        _askable_check(run)
        tick = tick_begin(run=run)
        decision = Decision.objects.get(tick=tick, resident=resident)
        if decision.status != Decision.Status.PENDING:
            raise RunStateError(
                f"{resident.name}'s decision in tick {tick.index} of run {run.pk} was asked "
                f"for already (decision {decision.pk}, {decision.status}); GET it instead"
            )
        # Someone is waiting for this one: ahead of the tick loop's (a setting).
        return decision_dispatch(
            decision=decision, send=send, priority=settings.INFERENCE_PRIORITY_REQUESTED
        )
    finally:
        run_lease_release(run=run, owner=owner)
