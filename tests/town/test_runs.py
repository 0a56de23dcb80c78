"""Run creation and controls (the services the management commands and buttons call)."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction

from tests.town.factories import run_factory, small_town_factory
from town import services
from town.demo import demo_town_create
from town.errors import RunStateError, TownError
from town.models import Memory, Place, Resident, Run
from town.selectors import runs_due

pytestmark = pytest.mark.django_db


def test_demo_town_is_deterministic_from_its_seed():
    def picture(town):
        residents = Resident.objects.filter(town=town).order_by("id")
        return [(r.name, r.home.name, r.money, r.hunger, r.energy) for r in residents]

    a = picture(demo_town_create(seed=7, name="A"))
    b = picture(demo_town_create(seed=7, name="B"))
    c = picture(demo_town_create(seed=8, name="C"))
    assert a == b and a != c
    assert len(a) == 10 and len({name for name, *_ in a}) == 10
    kinds = set(Place.objects.filter(town__name="A").values_list("kind", flat=True))
    assert {"kissaten", "cafe", "bakery", "bookshop", "park", "shrine", "station", "home"} <= kinds
    assert Place.objects.filter(town__name="A").count() == 12
    for home in Place.objects.filter(town__name="A", kind="home"):
        assert home.household.count() <= home.capacity


def test_seed_town_command_is_idempotent_and_replaces_on_request(capsys):
    call_command("seed_town", "--seed", "3")
    call_command("seed_town", "--seed", "3")
    assert "exists already" in capsys.readouterr().out
    call_command("seed_town", "--seed", "4", "--replace")
    assert Resident.objects.count() == 10


def test_run_create_starts_everyone_at_home():
    town = small_town_factory()
    run = run_factory(town=town, layout="naive", concurrency=2)
    states = list(run.resident_states.select_related("resident"))
    assert len(states) == 4 and all(s.place_id == s.resident.home_id for s in states)
    assert run.status == Run.Status.CREATED and run.nodes == ["local"]
    assert run.model == services.served_model()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"layout": "fancy"}, "unknown layout 'fancy'"),
        ({"routing": "random"}, "unknown routing 'random'; use one of cache_aware, round_robin"),
        ({"concurrency": 0}, "concurrency must be at least 1"),
        ({"nodes": ["nowhere"]}, "unknown inference node 'nowhere'"),
        ({"model": "gpt-9"}, "set POKOMACHI_MODEL=gpt-9"),
        ({"ticks_target": 0}, "ticks_target must be at least 1"),
        ({"retention_interval": 2048}, "set POKOMACHI_RETENTION_INTERVAL=2048"),
        ({"num_residents": 99}, "num_residents must be between 1"),
        ({"diary_chars": -1}, "diary_chars must be 0 or more"),
        ({"minutes_per_tick": 0}, "minutes_per_tick must be at least 1, got 0"),
        ({"decision_timeout_s": 0.0}, "decision_timeout_s must be positive"),
        ({"decision_timeout_s": float("nan")}, "decision_timeout_s must be positive"),
        ({"temperature": 2.5}, r"temperature must be within 0\.\.2"),
        ({"temperature": float("nan")}, r"temperature must be within 0\.\.2"),
    ],
)
def test_run_create_refuses_bad_input(fields, message):
    with pytest.raises(TownError, match=message):
        run_factory(town=small_town_factory(), **fields)
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    "fields",
    [
        {"layout": "fancy"},
        {"routing": "random"},
        {"concurrency": 0},
        {"ticks_target": 0},
        {"minutes_per_tick": 0},
        {"decision_timeout_s": 0.0},
        {"temperature": -0.5},
        {"temperature": 2.5},
    ],
)
def test_the_database_refuses_a_bad_run_whatever_writes_it(fields):
    """The CHECK constraints hold for writes that skip the validators (update(), raw saves)."""
    run = run_factory(town=small_town_factory())
    refused = r"CHECK constraint failed|violates check constraint"
    with pytest.raises(IntegrityError, match=refused), transaction.atomic():
        Run.objects.filter(pk=run.pk).update(**fields)
    with pytest.raises(IntegrityError, match=refused), transaction.atomic():
        Run.objects.create(town=run.town, model=run.model, nodes=["local"], **fields)
    run.refresh_from_db()
    assert run.concurrency == 4 and Run.objects.count() == 1


def test_a_run_gets_the_deployments_routing_unless_it_names_its_own(settings):
    settings.INFERENCE_ROUTING_POLICY = "round_robin"
    town = small_town_factory()
    assert run_factory(town=town).routing == "round_robin"
    assert run_factory(town=town, routing="fixed").routing == "fixed"


def test_run_controls_follow_the_state_machine():
    run = run_factory(town=small_town_factory())
    with pytest.raises(RunStateError, match=r"cannot pause run \d+: it is created"):
        services.run_pause(run=run)
    assert list(runs_due()) == []
    run = services.run_start(run=run)
    assert list(runs_due()) == [run]
    run = services.run_pause(run=run)
    assert list(runs_due()) == []
    run = services.run_step(run=run)
    assert run.status == "paused" and run.num_steps_pending == 1 and list(runs_due()) == [run]
    run = services.run_stop(run=run)
    assert run.num_steps_pending == 0 and list(runs_due()) == []
    with pytest.raises(RunStateError, match="resumed, not started"):
        services.run_start(run=run)
    run = services.run_resume(run=run)
    assert run.status == "running"


def test_run_control_command_reports_errors_clearly(capsys):
    from django.core.management.base import CommandError

    run = run_factory(town=small_town_factory())
    call_command("run_control", str(run.pk), "step")
    assert f"run {run.pk}: paused" in capsys.readouterr().out
    with pytest.raises(CommandError, match="cannot pause"):
        call_command("run_control", str(run.pk), "pause")
    with pytest.raises(CommandError, match="no run 999999"):
        call_command("run_control", "999999", "stop")


def test_lease_lets_one_process_advance_a_run():
    run = run_factory(town=small_town_factory())
    assert services.run_lease_take(run=run, owner="a", seconds=30)
    assert services.run_lease_take(run=run, owner="a", seconds=30)  # renew
    assert not services.run_lease_take(run=run, owner="b", seconds=30)
    services.run_lease_release(run=run, owner="a")
    assert services.run_lease_take(run=run, owner="b", seconds=30)
    assert not Memory.objects.filter(run=run).exists()


def test_tick_loop_starts_a_first_run_only_on_a_fresh_database():
    from town.management.commands.tick_loop import Command

    command = Command()
    command.first_run_start()  # no town: nothing to do
    assert not Run.objects.exists()
    town = small_town_factory()
    command.first_run_start()
    command.first_run_start()
    (run,) = Run.objects.all()
    assert run.town == town and run.status == Run.Status.RUNNING and run.layout == "shared_head"


def test_a_run_records_the_retention_interval_its_engines_use(settings):
    settings.INFERENCE_ENGINE = {**settings.INFERENCE_ENGINE, "retention_interval": 1024}
    town = small_town_factory()
    assert run_factory(town=town).retention_interval == 1024
    assert run_factory(town=town, retention_interval=1024).retention_interval == 1024
