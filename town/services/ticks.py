"""Tick services: begin a tick (one prompt and Decision per resident, from one snapshot of the
town, each routed to a node: services/routes.py) and finish it (apply every answer in resident
order, those that stay before those that go, let time pass, store, count).

Finishing is one transaction, so a tick is either wholly applied or not at all: a tick loop
that dies mid-tick leaves the tick open, and the next one picks it up where it was.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from town import events
from town.models import Decision, Memory, ResidentState, Run, Tick
from town.rules.effects import time_passes
from town.rules.prompts import prompt_build
from town.rules.world import World
from town.selectors import tick_decisions, tick_open, world_load
from town.services.choices import decision_parse
from town.services.decisions import decision_apply
from town.services.routes import decisions_route

S = Run.Status


@transaction.atomic
def tick_begin(*, run: Run) -> Tick:
    """The run's open tick if one was left half-done, else a new tick with its decisions."""
    open_tick = tick_open(run=run)
    if open_tick is not None:
        return open_tick
    index = run.num_ticks_done
    world = world_load(run=run, tick_index=index)
    tick = Tick.objects.create(
        run=run,
        index=index,
        day=world.clock.day,
        minute_of_day=world.clock.minute_of_day,
        phase=world.clock.phase,
    )
    decisions = []
    for resident in world.residents:
        prompt = prompt_build(world=world, resident=resident, layout=run.layout)
        decisions.append(
            Decision(
                run=run,
                tick=tick,
                resident_id=resident.id,
                messages=prompt.messages,
                prompt_hash=prompt.prompt_hash,
                head_hash=prompt.head_hash,
                json_schema=prompt.json_schema,
                resident_state=resident.snapshot(),
            )
        )
    decisions_route(run=run, decisions=decisions)  # each decision's node, by the run's routing
    Decision.objects.bulk_create(decisions)
    return tick


def _world_save(*, run: Run, world: World) -> None:
    states = {s.resident_id: s for s in ResidentState.objects.filter(run=run)}
    for resident in world.residents:
        state = states[resident.id]
        state.place_id = resident.place_id
        state.money, state.hunger, state.energy = resident.money, resident.hunger, resident.energy
        state.visits = {str(k): v for k, v in sorted(resident.visits.items())}
    ResidentState.objects.bulk_update(
        states.values(), ["place", "money", "hunger", "energy", "visits"]
    )


@transaction.atomic
def tick_finish(*, tick: Tick) -> Tick:
    """Apply the tick's answered decisions in resident order and close the tick."""
    tick = Tick.objects.select_for_update().get(pk=tick.pk)
    assert tick.status == Tick.Status.DECIDING, f"{tick} is finished already"
    run = Run.objects.select_for_update().get(pk=tick.run_id)
    world = world_load(run=run, tick_index=tick.index)
    places_before = {r.id: r.place_id for r in world.residents}
    decisions = tick_decisions(tick=tick)
    notes = []
    for decision in sorted(decisions, key=_moves_last):
        notes += decision_apply(world=world, decision=decision)
    time_passes(world)
    _world_save(run=run, world=world)
    Memory.objects.bulk_create(
        Memory(run=run, resident_id=resident_id, tick_index=tick.index, text=text[:300])
        for resident_id, text in notes
    )
    tick.status, tick.finished_at = Tick.Status.DONE, timezone.now()
    tick.save(update_fields=["status", "finished_at"])
    status_before = run.status
    _run_count_tick(run)
    events.tick_finished_emit(
        run=run,
        tick=tick,
        decisions=decisions,
        world=world,
        places_before=places_before,
        status_before=status_before,
    )
    return tick


def _moves_last(decision: Decision) -> bool:
    """Everything done where the residents stood is applied before anyone walks away (in
    resident order within each): a talk finds the people the prompt showed there."""
    value, _ = decision_parse(decision=decision)
    return value is not None and value["action"] == "go"


def _run_count_tick(run: Run) -> None:
    run.num_ticks_done += 1
    if run.status == S.PAUSED and run.num_steps_pending:
        run.num_steps_pending -= 1
    if run.ticks_target is not None and run.num_ticks_done >= run.ticks_target:
        run.status, run.finished_at, run.num_steps_pending = S.FINISHED, timezone.now(), 0
    run.save(update_fields=["num_ticks_done", "num_steps_pending", "status", "finished_at"])
