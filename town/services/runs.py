"""Run services: create a run and control it (start, pause, resume, step, stop), and the lease
that makes sure only one process advances a run at a time."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from inference.errors import UnknownNodeError
from inference.fleet.nodes import node_names, node_require
from inference.services import completion_model, completion_retention_interval
from town import events
from town.errors import RunStateError, TownError
from town.models import DEFAULT_TEMPERATURE, Resident, ResidentState, Run, Town

S = Run.Status


def served_model() -> str:
    """The model this deployment's nodes serve (env POKOMACHI_MODEL, or POKOMACHI_OPENAI_MODEL
    when an external OpenAI-compatible server answers)."""
    return completion_model()


def served_retention_interval() -> int | None:
    """The retention interval the nodes' engines use (env POKOMACHI_RETENTION_INTERVAL)."""
    return completion_retention_interval()


def default_decision_timeout_s() -> float:
    """Longer than the broker takes to hand a dead worker's decision to another worker (its
    visibility timeout, then a restore sweep), so such a decision is retried, not timed out."""
    options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}) or {}
    return float(options.get("visibility_timeout", 3600)) + 300.0


@transaction.atomic
def run_create(
    *,
    town: Town,
    layout: str = Run.Layout.SHARED_HEAD,
    nodes: list[str] | None = None,
    concurrency: int = 4,
    seed: int = 0,
    ticks_target: int | None = None,
    retention_interval: int | None = None,
    temperature: float = DEFAULT_TEMPERATURE,
    minutes_per_tick: int = 120,
    decision_timeout_s: float | None = None,
    model: str | None = None,
    num_residents: int | None = None,
    diary_chars: int = 0,
    routing: str | None = None,
) -> Run:
    """A new run of `town`, every resident at home with their starting state.

    `num_residents` takes only the town's first N residents (by id) into the run; `diary_chars`
    gives every prompt that many characters of each resident's older diary. `routing`: how its
    decisions are spread over its nodes (default: settings.INFERENCE_ROUTING_POLICY)."""
    if decision_timeout_s is None:
        decision_timeout_s = default_decision_timeout_s()
    run = Run(
        town=town,
        layout=layout,
        concurrency=concurrency,
        seed=seed,
        diary_chars=diary_chars,
        ticks_target=ticks_target,
        temperature=temperature,
        minutes_per_tick=minutes_per_tick,
        decision_timeout_s=decision_timeout_s,
        routing=routing or settings.INFERENCE_ROUTING_POLICY,
    )
    _run_fields_check(run)
    run.nodes = _nodes_served(nodes)
    run.retention_interval = _retention_interval_served(retention_interval)
    run.model = _model_served(model)
    residents = _residents_taken(town=town, num_residents=num_residents)
    run.save()
    ResidentState.objects.bulk_create(
        ResidentState(
            run=run,
            resident=r,
            place_id=r.home_id,
            money=r.money,
            hunger=r.hunger,
            energy=r.energy,
            visits=dict(r.visits),
        )
        for r in residents
    )
    return run


# The deployment's fields: what this run may ask for depends on what the workers serve.
_DEPLOYMENT_FIELDS = ["town", "nodes", "model", "retention_interval"]


def _run_fields_check(run: Run) -> None:
    """The run's own settings, by the model's validators (town/models.py: Run); the database's
    constraints say the same, so checking them here too would only cost queries."""
    try:
        run.full_clean(
            exclude=_DEPLOYMENT_FIELDS, validate_unique=False, validate_constraints=False
        )
    except ValidationError as exc:
        raise TownError("; ".join(exc.messages)) from None


def _nodes_served(nodes: list[str] | None) -> list[str]:
    try:
        return [node_require(name) for name in (list(nodes) if nodes else node_names())]
    except UnknownNodeError as exc:
        raise TownError(str(exc)) from exc


def _retention_interval_served(retention_interval: int | None) -> int | None:
    served_interval = served_retention_interval()
    if retention_interval is None or retention_interval == served_interval:
        return served_interval
    served = "dense" if served_interval is None else served_interval
    raise TownError(
        f"this deployment's engines use retention interval {served}, not "
        f"{retention_interval}: set "
        f"POKOMACHI_RETENTION_INTERVAL={retention_interval} and restart the workers, or leave "
        "it out (`manage.py experiment` runs each interval on its own engine)"
    )


def _model_served(model: str | None) -> str:
    if model is not None and model != served_model():
        raise TownError(
            f"this deployment's nodes serve {served_model()!r}, not {model!r}: set "
            f"POKOMACHI_MODEL={model} and restart the workers, or leave the model out"
        )
    return served_model()


def _residents_taken(*, town: Town, num_residents: int | None) -> list[Resident]:
    residents = list(Resident.objects.filter(town=town).order_by("id"))
    if not residents:
        raise TownError(f"town {town.name!r} has no residents; seed it with seed_town")
    if num_residents is not None and not 1 <= num_residents <= len(residents):
        raise TownError(
            f"num_residents must be between 1 and the town's {len(residents)} residents, "
            f"got {num_residents}"
        )
    return residents if num_residents is None else residents[:num_residents]


def _locked(run: Run) -> Run:
    return Run.objects.select_for_update().get(pk=run.pk)


# The statuses each control acts on: its service checks them, and the admin shows a run's page
# only the buttons that apply.
RUN_CONTROL_STATUSES = {
    "start": (S.CREATED,),
    "pause": (S.RUNNING,),
    "resume": (S.PAUSED, S.STOPPED),
    "step": (S.CREATED, S.PAUSED, S.STOPPED),
    "stop": (S.CREATED, S.RUNNING, S.PAUSED),
}


def _require(run: Run, verb: str, hint: str) -> None:
    if run.status not in RUN_CONTROL_STATUSES[verb]:
        raise RunStateError(f"cannot {verb} run {run.pk}: it is {run.status}; {hint}")


def _save(run: Run, *fields: str) -> Run:
    run.save(update_fields=["status", *fields])
    events.run_state_emit(run=run)
    return run


@transaction.atomic
def run_start(*, run: Run) -> Run:
    run = _locked(run)
    _require(run, "start", "a paused or stopped run is resumed, not started")
    run.status, run.started_at = S.RUNNING, timezone.now()
    return _save(run, "started_at")


@transaction.atomic
def run_pause(*, run: Run) -> Run:
    """Pause after the tick in progress; a paused run can be stepped or resumed."""
    run = _locked(run)
    _require(run, "pause", "only a running run can be paused")
    run.status = S.PAUSED
    return _save(run)


@transaction.atomic
def run_resume(*, run: Run) -> Run:
    """Run again from the last complete tick (a tick left half-done is finished first)."""
    run = _locked(run)
    _require(run, "resume", "start a created run; a finished one is done")
    run.status, run.num_steps_pending = S.RUNNING, 0
    return _save(run, "num_steps_pending")


@transaction.atomic
def run_step(*, run: Run) -> Run:
    """One more tick, then paused again."""
    run = _locked(run)
    _require(run, "step", "pause a running run first")
    run.status = S.PAUSED
    run.num_steps_pending += 1
    run.started_at = run.started_at or timezone.now()
    return _save(run, "num_steps_pending", "started_at")


@transaction.atomic
def run_stop(*, run: Run) -> Run:
    """Stop after the tick in progress; a stopped run can be resumed later."""
    run = _locked(run)
    _require(run, "stop", "it is not going")
    run.status, run.num_steps_pending = S.STOPPED, 0
    return _save(run, "num_steps_pending")


# What a person may do to a run: the staff buttons on its page (town/views.py) and
# `manage.py run_control` both look the service up here.
RUN_CONTROLS = {
    "start": run_start,
    "pause": run_pause,
    "resume": run_resume,
    "step": run_step,
    "stop": run_stop,
}


def run_control_statuses() -> dict[str, list[str]]:
    """Each control (in RUN_CONTROLS order) with the statuses it acts on: the one rule for
    which buttons a run's pages show (the live page applies it again as the status changes)."""
    return {name: [str(status) for status in RUN_CONTROL_STATUSES[name]] for name in RUN_CONTROLS}


def run_controls_available(*, run: Run) -> list[str]:
    """The controls that apply to `run` as it is now, in RUN_CONTROLS order."""
    return [name for name, statuses in run_control_statuses().items() if run.status in statuses]


def run_lease_take(*, run: Run, owner: str, seconds: float) -> bool:
    """Take (or renew) the right to advance `run` for `seconds`; False if another holds it."""
    now = timezone.now()
    free = Q(lease_owner=owner) | Q(lease_owner="") | Q(lease_expires_at__lt=now)
    expires = now + dt.timedelta(seconds=seconds)
    taken = Run.objects.filter(free, pk=run.pk).update(lease_owner=owner, lease_expires_at=expires)
    return taken == 1


def run_lease_release(*, run: Run, owner: str) -> None:
    Run.objects.filter(pk=run.pk, lease_owner=owner).update(lease_owner="", lease_expires_at=None)
