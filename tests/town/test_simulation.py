"""Ticks end to end in this process: prompts → engine (the tiny random model, on InlineSend's
threads) → decisions → applied in resident order. The Celery path is in test_tasks.py."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from inference.completions.runtime import engine_configured
from tests.town.factories import run_factory, small_town_factory
from town import services
from town.demo import demo_town_create
from town.models import Decision, Memory, Run, Tick
from town.selectors import run_summary, runs_due, world_load
from town.simulation import InlineSend, tick_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def inline_send():
    send = InlineSend(max_workers=4)
    yield send
    send.shutdown()


def _answer(decision: Decision, value) -> None:
    """Store an answer as a worker would (for tests of how answers are applied)."""
    text = value if isinstance(value, str) else json.dumps(value)
    Decision.objects.filter(pk=decision.pk).update(
        status=Decision.Status.COMPUTED, raw_output=text, finish_reason="stop"
    )


def test_two_ticks_of_the_demo_town(inline_send):
    town = demo_town_create(seed=0)
    run = services.run_start(run=run_factory(town=town, ticks_target=2, concurrency=4))
    progress = []
    for _ in range(2):
        tick = tick_run(run_id=run.pk, send=inline_send, owner="test", progress=progress.append)
        assert tick.status == Tick.Status.DONE
    run.refresh_from_db()
    assert run.status == Run.Status.FINISHED and run.num_ticks_done == 2
    assert sum(progress) == 20
    assert [(t.index, t.day, t.minute_of_day) for t in run.ticks.all()] == [
        (0, 1, 420),
        (1, 1, 540),
    ]
    decisions = list(run.decisions.all())
    assert len(decisions) == 20
    for d in decisions:
        assert d.status == Decision.Status.APPLIED and d.valid, (d.error, d.raw_output)
        assert d.num_prompt_tokens > 800 and d.num_output_tokens > 5
        assert d.prefill_s > 0 and d.engine_e2e_s > 0 and d.app_e2e_s >= d.engine_e2e_s
        assert d.metrics["num_prompt_tokens"] == d.num_prompt_tokens
        assert d.dispatched_at <= d.started_at <= d.computed_at <= d.applied_at
        assert d.attempts == 1 and d.retries == 0
        # The engine's lost-token accounting is stored by reason (llama: nothing lost to
        # retention; the head's partial last block is lost to alignment).
        assert set(d.lost_tokens) == {"retention", "alignment", "eviction"}
        assert d.lost_tokens["retention"] == 0
    # The shared head is prefilled once and then reused.
    assert sum(1 for d in decisions if d.num_cached_tokens >= 1000) >= 15
    summary = run_summary(run=run)
    assert summary.num_decisions == 20 and 0.5 < summary.token_cache_hit_rate < 1
    assert Memory.objects.filter(run=run).count() >= 20
    hungrier = [
        s.hunger > s.resident.hunger for s in run.resident_states.select_related("resident")
    ]
    assert any(hungrier)


def test_answers_are_applied_in_resident_order():
    """Four residents go for the café's two seats (the answers here are written by hand, not
    decoded under the schema, which offers the café only to the first two in line): the seats
    stay kept for those two, whatever came back first; the others' decisions are recorded as
    impossible and they stay home."""
    town = small_town_factory()  # café: room for 2
    run = services.run_start(run=run_factory(town=town, minutes_per_tick=60))
    Run.objects.filter(pk=run.pk).update(start_minutes=9 * 60)
    run.refresh_from_db()
    tick = services.tick_begin(run=run)
    aki, ben, chie, dai = tick.decisions.order_by("resident_id")
    for decision in (dai, chie, ben):  # answered in reverse order
        _answer(decision, {"action": "go", "target": "Cafe", "reason": "I need coffee."})
    _answer(aki, '{"action": "go", "target": "Cafe"')  # cut off: not JSON
    services.tick_finish(tick=tick)
    aki, ben, chie, dai = tick.decisions.order_by("resident_id")
    assert (aki.valid, ben.valid, chie.valid, dai.valid) == (False, True, False, False)
    assert "not JSON" in aki.error
    assert all("outside the decision schema" in d.error for d in (chie, dai))
    world = world_load(run=run, tick_index=1)
    places = {r.name: world.place(r.place_id).name for r in world.residents}
    assert places == {"Aki": "Home A", "Ben": "Cafe", "Chie": "Home B", "Dai": "Home B"}
    assert Memory.objects.filter(run=run, resident__name="Ben").first().text.startswith("Went")
    assert not Memory.objects.filter(run=run, resident__name="Dai").exists()


def test_an_answer_outside_the_schema_is_rejected():
    run = services.run_start(run=run_factory(town=small_town_factory()))
    tick = services.tick_begin(run=run)
    first = tick.decisions.order_by("resident_id").first()
    _answer(first, {"action": "go", "target": "Moon", "reason": "I wonder why not."})
    Decision.objects.filter(tick=tick).exclude(pk=first.pk).update(
        status=Decision.Status.FAILED, error="engine refused: test"
    )
    services.tick_finish(tick=tick)
    first.refresh_from_db()
    assert first.valid is False and "outside the decision schema" in first.error
    assert set(tick.decisions.values_list("valid", flat=True)) == {False}


def test_a_decision_that_never_comes_back_times_out_and_the_run_goes_on():
    run = run_factory(town=small_town_factory(), decision_timeout_s=0.3, concurrency=2)
    run = services.run_start(run=run)

    def send_nowhere(decision_id: int, node: str, send: int) -> None:  # a message the broker lost
        pass

    tick = tick_run(run_id=run.pk, send=send_nowhere, owner="test", poll_s=0.05)
    decisions = list(tick.decisions.all())
    assert {d.status for d in decisions} == {Decision.Status.TIMED_OUT}
    assert all(d.valid is False and "no answer within 0.3 s" in d.error for d in decisions)
    world = world_load(run=run, tick_index=1)
    assert all(r.place_id == r.home_id for r in world.residents)
    run.refresh_from_db()
    assert run.num_ticks_done == 1 and run.status == Run.Status.RUNNING


def test_a_half_done_tick_is_resumed_not_redone(inline_send):
    run = services.run_start(run=run_factory(town=small_town_factory()))
    tick = services.tick_begin(run=run)  # the tick loop died right after this
    first = tick.decisions.order_by("resident_id").first()
    services.decision_dispatch(decision=first, send=inline_send)
    again = tick_run(run_id=run.pk, send=inline_send, owner="test")
    assert again.pk == tick.pk and again.status == Tick.Status.DONE
    assert Decision.objects.filter(run=run).count() == 4
    assert all(d.attempts == 1 for d in Decision.objects.filter(run=run))


def test_a_step_runs_one_tick_then_the_run_waits(inline_send):
    run = services.run_step(run=run_factory(town=small_town_factory()))
    assert list(runs_due()) == [run]
    tick_run(run_id=run.pk, send=inline_send, owner="test")
    run.refresh_from_db()
    assert (run.status, run.num_steps_pending, run.num_ticks_done) == ("paused", 0, 1)
    assert list(runs_due()) == []


def test_run_town_inline_prints_the_summary(capsys):
    town = small_town_factory()
    call_command("run_town", "--ticks", "1", "--inline", "--town", town.name)
    out = capsys.readouterr().out
    for label in ["token cache hit rate", "cached tokens, mean", "prefill, mean (s)",
                  "queue, mean (s)", "decode, mean (s)", "end-to-end, median (s)",
                  "prompt tokens, mean"]:  # fmt: skip
        assert label in out
    assert Run.objects.get(town=town).status == Run.Status.FINISHED


def test_run_town_exits_non_zero_when_a_ticks_decisions_all_failed(settings):
    """A server that fails every request (as llama-cpp-python's did to json_schema, before the
    client learned its dialect): the command fails with the first error on one line."""
    from django.core.management.base import CommandError

    from inference.completions.remote_dialects import dialect_memory
    from tests.inference.completions.test_remote_dialects import StubServer

    town = small_town_factory()
    stub = StubServer("none of them", refusal_status=500)
    with stub.serving() as base_url:
        settings.INFERENCE_OPENAI = {"base_url": base_url, "model": "stub-model", "api_key": ""}
        dialect_memory().forget(base_url)
        with pytest.raises(CommandError) as caught:
            call_command("run_town", "--ticks", "2", "--inline", "--town", town.name)
    message = str(caught.value)
    num_residents = town.residents.count()
    assert "\n" not in message
    assert f"tick 0: all {num_residents} decisions failed; the first" in message
    assert f"{base_url} failed the request" in message
    run = Run.objects.get(town=town)
    assert (run.status, run.num_ticks_done) == (Run.Status.STOPPED, 1)


def test_the_world_knows_each_residents_choices_of_the_last_two_ticks():
    run = services.run_start(run=run_factory(town=small_town_factory(), minutes_per_tick=30))
    Run.objects.filter(pk=run.pk).update(start_minutes=9 * 60)
    run.refresh_from_db()
    for _ in range(3):  # Aki stays home three times; the others' answers are refused
        run.refresh_from_db()
        tick = services.tick_begin(run=run)
        aki = tick.decisions.order_by("resident_id").first()
        _answer(aki, {"action": "stay", "target": "Home A", "reason": "I like it here."})
        Decision.objects.filter(tick=tick).exclude(pk=aki.pk).update(
            status=Decision.Status.FAILED, error="engine refused: test"
        )
        services.tick_finish(tick=tick)
    aki_id = aki.resident_id
    choices = {
        i: world_load(run=run, tick_index=i).resident(aki_id).recent_choices for i in range(4)
    }
    assert choices[0] == [] and choices[1] == [("stay", "Home A")]
    assert choices[2] == [("stay", "Home A"), ("stay", "Home A")]
    aki.refresh_from_db()  # the third stay was not offered: outside that tick's schema
    offered = [case["properties"]["action"]["const"] for case in aki.json_schema["anyOf"]]
    assert "stay" not in offered and "go" in offered
    assert aki.valid is False and "outside the decision schema" in aki.error
    assert choices[3] == []  # the refused stay broke the run of choices
    ben = world_load(run=run, tick_index=2).residents[1]
    assert ben.recent_choices == []  # refused answers are no choices


def test_a_talk_finds_the_one_who_walks_away_in_the_same_tick():
    """Aki leaves for the café while Ben, after her in resident order, talks to her: what is
    done where the residents stood is applied before anyone goes."""
    run = services.run_start(run=run_factory(town=small_town_factory(), minutes_per_tick=60))
    Run.objects.filter(pk=run.pk).update(start_minutes=9 * 60)
    run.refresh_from_db()
    tick = services.tick_begin(run=run)
    aki, ben, chie, dai = tick.decisions.order_by("resident_id")
    _answer(aki, {"action": "go", "target": "Cafe", "reason": "I need coffee."})
    _answer(ben, {"action": "talk", "target": "Aki", "reason": "I want to say hello."})
    Decision.objects.filter(pk__in=[chie.pk, dai.pk]).update(
        status=Decision.Status.FAILED, error="engine refused: test"
    )
    services.tick_finish(tick=tick)
    aki, ben = (Decision.objects.get(pk=d.pk) for d in (aki, ben))
    assert (aki.valid, ben.valid) == (True, True), ben.error
    assert Memory.objects.filter(run=run, resident__name="Aki", text__contains="Ben").exists()


def test_a_ticks_schemas_are_compiled_before_its_decisions_are_sent():
    """Issue 33, item 6: the tick warms its distinct schemas first, so no decision compiles."""
    run = services.run_start(run=run_factory(town=small_town_factory(), concurrency=4))
    compiles_after_warm = []
    with engine_configured() as engine:  # an empty grammar cache
        cache = engine.structured.cache

        class WarmCounted(InlineSend):
            def warm_schemas(self, node_to_schemas):
                super().warm_schemas(node_to_schemas)
                compiles_after_warm.append(cache.num_compiles)

        send = WarmCounted(max_workers=4)
        try:
            tick = tick_run(run_id=run.pk, send=send, owner="test")
        finally:
            send.shutdown()
        num_compiles = cache.num_compiles
    decisions = list(run.decisions.filter(tick=tick))
    distinct = {json.dumps(d.json_schema) for d in decisions}
    assert len(decisions) == 4 and distinct
    assert compiles_after_warm == [len(distinct)]
    assert num_compiles == len(distinct)  # the decisions themselves compiled nothing
    for d in decisions:
        assert d.status == Decision.Status.APPLIED, d.error
        assert d.metrics["grammar_compile_s"] < 0.05, d.metrics
