"""The talk's experiment (`manage.py experiment`): prompt layouts per step, scaling, one stored
Run per step on a fresh engine, the summary table, and determinism from the seed.

End-to-end runs use the tiny random models in this process; the real-model tables are in
docs/PERFORMANCE.md.
"""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from inference.completions.tokens import chat_token_counts
from tests.town.factories import run_factory
from town.demo import demo_town_create
from town.models import Decision, Run
from town.reports import experiment_table
from town.rules.diary import diary_lines
from town.rules.prompts import num_shared_messages, prompt_build
from town.selectors import run_summary, world_load
from town.services.experiments import (
    TALK_STEPS,
    experiment_run,
    experiment_scaling,
    scaled_interval,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_scaled_intervals_round_down_to_whole_blocks():
    assert scaled_interval(4096, 0.25) == 1024
    assert scaled_interval(2048, 0.2) == 400  # 409.6 → 25 blocks
    assert scaled_interval(1024, 0.001) == 16  # never below one block


def test_shared_rules_layout_shares_its_head_and_keeps_menus_per_resident():
    town = demo_town_create(seed=0)
    world = world_load(run=run_factory(town=town), tick_index=0)
    a, b = world.residents[:2]
    pa = prompt_build(world=world, resident=a, layout="shared_rules")
    pb = prompt_build(world=world, resident=b, layout="shared_rules")
    assert pa.head_messages == pb.head_messages
    head = "".join(m["content"] for m in pa.head_messages)
    assert "Answer with one JSON object" in head  # the format is in the head at this step
    assert "curry pan 220" not in head  # menus and prices stay per resident
    assert "curry pan 220" in pa.messages[-1]["content"]
    rules = pa.messages[0]["content"]
    assert a.name not in rules and b.name not in rules


def test_diary_is_deterministic_and_sized():
    town = demo_town_create(seed=0)
    world = world_load(run=run_factory(town=town), tick_index=0)
    resident = world.residents[0]
    lines = diary_lines(world=world, resident=resident, seed=3, num_chars=2000)
    assert lines == diary_lines(world=world, resident=resident, seed=3, num_chars=2000)
    assert lines != diary_lines(world=world, resident=resident, seed=4, num_chars=2000)
    size = sum(len(line) + 1 for line in lines)
    assert 2000 <= size < 2000 + 300
    assert diary_lines(world=world, resident=resident, seed=3, num_chars=0) == []


def test_a_run_with_a_diary_and_fewer_residents():
    town = demo_town_create(seed=0)
    run = run_factory(town=town, num_residents=3, diary_chars=1500)
    world = world_load(run=run, tick_index=0)
    assert len(world.residents) == 3
    prompt = prompt_build(world=world, resident=world.residents[0], layout="shared_head")
    assert "diary (older days" in prompt.messages[-1]["content"]


def test_scaling_measures_the_shared_head_with_the_engine_tokenizer():
    town = demo_town_create(seed=0)
    scaling = experiment_scaling(town=town, num_residents=3, seed=0, scale=None)
    assert Run.objects.count() == 0  # the probe run was rolled back
    assert 200 < scaling.head_tokens < scaling.prompt_tokens_before
    assert scaling.scale == pytest.approx(scaling.head_tokens / 2247)
    assert scaling.intervals[4096] > scaling.head_tokens > scaling.intervals[2048]
    assert all(v % 16 == 0 for v in scaling.intervals.values())
    assert scaling.diary_chars > 0


def _outputs(experiment) -> list[list[tuple[str, str]]]:
    return [
        list(
            Decision.objects.filter(run=r.run)
            .order_by("tick__index", "resident_id")
            .values_list("prompt_hash", "raw_output")
        )
        for r in experiment.steps
    ]


def test_experiment_runs_every_step_and_is_deterministic_from_the_seed():
    town = demo_town_create(seed=0)
    first = experiment_run(town=town, model=None, ticks=1, num_residents=2, seed=5, scale=0.08)
    assert [r.step.number for r in first.steps] == [s.number for s in TALK_STEPS]
    assert [r.run.layout for r in first.steps] == [s.layout for s in TALK_STEPS]
    assert [r.retention_interval for r in first.steps] == [320, 320, 160, 160, 80, 80, None]
    for result in first.steps:
        assert result.run.status == Run.Status.FINISHED
        assert result.run.decisions.filter(num_prompt_tokens__isnull=False).count() == 2
    # Same prompts, same (greedy) decisions: the first step and the last, run again.
    again = (TALK_STEPS[0], TALK_STEPS[-1])
    second = experiment_run(
        town=town, model=None, ticks=1, num_residents=2, seed=5, scale=0.08, steps=again
    )
    outputs = _outputs(first)
    assert _outputs(second) == [outputs[0], outputs[-1]]

    table = experiment_table(experiment=first)
    assert "step 7" in table and "shared_then_resident_head" in table
    # The tiny llama has no sliding-window layers: retention-only steps say so. Step 7 changes
    # its layout and the engine's features too, so it is an effect, not noise.
    assert "step 3 (*)" in table and "step 5 (*)" in table
    assert "step 4 (*)" not in table and "step 7 (*)" not in table
    assert "changes nothing" in table


def test_experiment_command_prints_the_table_and_the_compare_link(capsys):
    demo_town_create(seed=0)
    call_command("experiment", "--ticks", "1", "--residents", "2", "--scale", "0.05")
    out = capsys.readouterr().out
    assert "token cache hit rate" in out and "median" in out
    assert "/admin/town/run/compare/?ids=" in out
    assert "scaled ×0.050" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--residents", "1"], "at least 2 residents"),
        (["--ticks", "0"], "ticks must be at least 1"),
        (["--scale", "3"], "--scale must be in (0, 1]"),
        (["--town", "Nowhere"], "no town 'Nowhere'"),
    ],
)
def test_experiment_command_refuses_bad_input(args, message):
    demo_town_create(seed=0)
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call_command("experiment", *args)
    assert Run.objects.count() == 0


def test_on_a_sliding_window_model_reuse_follows_the_talks_pattern():
    """gemma3-tiny-random (window 512, the real tokenizer and layer pattern): no reuse until the
    retention interval fits under the shared head, then reuse on the interval's grid. Step 7
    keeps the window at every token and loses nothing to retention; every decision reuses the
    tick's warmed shared head, and from the second tick on the resident's own head too."""
    town = demo_town_create(seed=0)
    # The steps this test reads (4 and 5 only move the interval on down the grid).
    steps = tuple(s for s in TALK_STEPS if s.number in (1, 2, 3, 6, 7))
    experiment = experiment_run(
        town=town, model="gemma3-tiny-random", ticks=2, num_residents=2, seed=0, steps=steps
    )
    assert experiment.has_sliding_window_layers
    print("\n" + experiment.scaling.describe() + "\n" + experiment_table(experiment=experiment))
    by_step = {r.step.number: r for r in experiment.steps}

    def cached(number: int) -> list[int]:
        run = by_step[number].run
        return list(run.decisions.order_by("id").values_list("num_cached_tokens", flat=True))

    def lost_to_retention(number: int) -> int:
        run = by_step[number].run
        return sum(
            d.get("retention", 0) for d in run.decisions.values_list("lost_tokens", flat=True)
        )

    assert max(cached(1)) < 100  # naive: nothing worth the name is shared
    assert max(cached(2)) == 0 and lost_to_retention(2) > 0  # interval above the head
    interval3 = by_step[3].retention_interval
    assert interval3 in cached(3) and all(c % interval3 == 0 for c in cached(3))
    assert lost_to_retention(7) == 0
    for decision in by_step[7].run.decisions.select_related("tick"):
        shared, _ = chat_token_counts(
            model="gemma3-tiny-random",
            messages=decision.messages,
            num_head_messages=num_shared_messages(decision.messages),
        )
        own, total = chat_token_counts(
            model="gemma3-tiny-random", messages=decision.messages, num_head_messages=2
        )
        assert shared < own < total == decision.num_prompt_tokens
        # The shared head is warmed and pinned before each tick's fan-out; a resident's own
        # head (profile, diary) was computed by their decision in the tick before.
        assert decision.num_cached_tokens >= (own if decision.tick.index else shared)
    hit_rate = {
        r.step.number: run_summary(run=r.run).token_cache_hit_rate for r in experiment.steps
    }
    assert hit_rate[7] > 0.5 > hit_rate[6]
    assert "(*)" not in experiment_table(experiment=experiment)
