"""Run services: create a run and control it (start, pause, resume, step, stop), and the lease
that makes sure only one process advances a run at a time."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from inference.errors import UnknownNodeError
from inference.nodes import node_names, node_require
from inference.services import completion_model
from town import events
from town.errors import RunStateError, TownError
from town.models import Resident, ResidentState, Run, Town
from town.prompts import LAYOUTS

S = Run.Status


def served_model() -> str:
    """The model this deployment's nodes serve (env POKOMACHI_MODEL, or POKOMACHI_OPENAI_MODEL
    when an external OpenAI-compatible server answers)."""
    return completion_model()


def served_retention_interval() -> int | None:
    """The retention interval the nodes' engines use (env POKOMACHI_RETENTION_INTERVAL)."""
    return settings.INFERENCE_ENGINE.get("retention_interval")


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
    temperature: float = 0.0,
    minutes_per_tick: int = 120,
    decision_timeout_s: float | None = None,
    model: str | None = None,
    num_residents: int | None = None,
    diary_chars: int = 0,
) -> Run:
    """A new run of `town`, every resident at home with their starting state.

    `num_residents` takes only the town's first N residents (by id) into the run; `diary_chars`
    gives every prompt that many characters of each resident's older diary."""
    if decision_timeout_s is None:
        decision_timeout_s = default_decision_timeout_s()
    if layout not in LAYOUTS:
        raise TownError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    if concurrency < 1:
        raise TownError(f"concurrency must be at least 1 decision in flight, got {concurrency}")
    if ticks_target is not None and ticks_target < 1:
        raise TownError(f"ticks_target must be at least 1 (or None: no end), got {ticks_target}")
    if minutes_per_tick < 1:
        raise TownError(f"minutes_per_tick must be at least 1, got {minutes_per_tick}")
    if decision_timeout_s <= 0:
        raise TownError(f"decision_timeout_s must be positive, got {decision_timeout_s}")
    if not 0 <= temperature <= 2:
        raise TownError(f"temperature must be within 0..2 (0: greedy), got {temperature}")
    nodes = list(nodes) if nodes else node_names()
    try:
        nodes = [node_require(name) for name in nodes]
    except UnknownNodeError as exc:
        raise TownError(str(exc)) from exc
    served_interval = served_retention_interval()
    if retention_interval is None:
        retention_interval = served_interval
    elif retention_interval != served_interval:
        served = "dense" if served_interval is None else served_interval
        raise TownError(
            f"this deployment's engines use retention interval {served}, not "
            f"{retention_interval}: set "
            f"POKOMACHI_RETENTION_INTERVAL={retention_interval} and restart the workers, or leave "
            "it out (`manage.py experiment` runs each interval on its own engine)"
        )
    if model is not None and model != served_model():
        raise TownError(
            f"this deployment's nodes serve {served_model()!r}, not {model!r}: set "
            f"POKOMACHI_MODEL={model} and restart the workers, or leave the model out"
        )
    residents = list(Resident.objects.filter(town=town).order_by("id"))
    if not residents:
        raise TownError(f"town {town.name!r} has no residents; seed it with seed_town")
    if num_residents is not None:
        if not 1 <= num_residents <= len(residents):
            raise TownError(
                f"num_residents must be between 1 and the town's {len(residents)} residents, "
                f"got {num_residents}"
            )
        residents = residents[:num_residents]
    if diary_chars < 0:
        raise TownError(f"diary_chars must be 0 or more characters, got {diary_chars}")
    run = Run.objects.create(
        town=town,
        layout=layout,
        model=served_model(),
        nodes=nodes,
        concurrency=concurrency,
        seed=seed,
        diary_chars=diary_chars,
        ticks_target=ticks_target,
        retention_interval=retention_interval,
        temperature=temperature,
        minutes_per_tick=minutes_per_tick,
        decision_timeout_s=decision_timeout_s,
    )
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


def _locked(run: Run) -> Run:
    return Run.objects.select_for_update().get(pk=run.pk)


def _require(run: Run, allowed: tuple[str, ...], verb: str, hint: str) -> None:
    if run.status not in allowed:
        raise RunStateError(f"cannot {verb} run {run.pk}: it is {run.status}; {hint}")


def _save(run: Run, *fields: str) -> Run:
    run.save(update_fields=["status", *fields])
    events.run_state_emit(run=run)
    return run


@transaction.atomic
def run_start(*, run: Run) -> Run:
    run = _locked(run)
    _require(run, (S.CREATED,), "start", "a paused or stopped run is resumed, not started")
    run.status, run.started_at = S.RUNNING, timezone.now()
    return _save(run, "started_at")


@transaction.atomic
def run_pause(*, run: Run) -> Run:
    """Pause after the tick in progress; a paused run can be stepped or resumed."""
    run = _locked(run)
    _require(run, (S.RUNNING,), "pause", "only a running run can be paused")
    run.status = S.PAUSED
    return _save(run)


@transaction.atomic
def run_resume(*, run: Run) -> Run:
    """Run again from the last complete tick (a tick left half-done is finished first)."""
    run = _locked(run)
    _require(run, (S.PAUSED, S.STOPPED), "resume", "start a created run; a finished one is done")
    run.status, run.num_steps_pending = S.RUNNING, 0
    return _save(run, "num_steps_pending")


@transaction.atomic
def run_step(*, run: Run) -> Run:
    """One more tick, then paused again."""
    run = _locked(run)
    _require(run, (S.CREATED, S.PAUSED, S.STOPPED), "step", "pause a running run first")
    run.status = S.PAUSED
    run.num_steps_pending += 1
    run.started_at = run.started_at or timezone.now()
    return _save(run, "num_steps_pending", "started_at")


@transaction.atomic
def run_stop(*, run: Run) -> Run:
    """Stop after the tick in progress; a stopped run can be resumed later."""
    run = _locked(run)
    _require(run, (S.CREATED, S.RUNNING, S.PAUSED), "stop", "it is not going")
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


def run_lease_take(*, run: Run, owner: str, seconds: float) -> bool:
    """Take (or renew) the right to advance `run` for `seconds`; False if another holds it."""
    now = timezone.now()
    free = Q(lease_owner=owner) | Q(lease_owner="") | Q(lease_expires_at__lt=now)
    expires = now + dt.timedelta(seconds=seconds)
    taken = Run.objects.filter(free, pk=run.pk).update(lease_owner=owner, lease_expires_at=expires)
    return taken == 1


def run_lease_release(*, run: Run, owner: str) -> None:
    Run.objects.filter(pk=run.pk, lease_owner=owner).update(lease_owner="", lease_expires_at=None)
