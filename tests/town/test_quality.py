"""The decision-quality measures (town/quality.py) on crafted examples, and town_quality end to
end on the tiny random model."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from tests.town.factories import small_town_factory
from town.models import Run
from town.quality import (
    DecisionRecord,
    FoodOffer,
    echo_of,
    town_quality_measure,
)
from town.rules.needs import pressing_need

PROMPT = [
    "Rules of the town:\n1. Go only to a place that is open now and not full.\n"
    "6. Above 70 hunger, eat soon. Below 25 energy, go home and rest.",
    "## What you can do now (action: targets)\n- go: Panya Mugi; Sakura Park\n"
    "Decide what Yuto Yamamoto does next.",
]
FOOD = FoodOffer(items=frozenset({"melon pan"}), places={"Panya Mugi": 180})


def _record(**fields) -> DecisionRecord:
    base = dict(
        resident="Yuto",
        tick_index=0,
        clock="Day 1, 07:00 (morning)",
        home="Sakura-so",
        place="Sakura Park",
        money=1000,
        hunger=40,
        energy=60,
        options={"go": ["Panya Mugi", "Sakura-so"], "stay": ["Sakura Park"]},
        prompt=PROMPT,
        action="stay",
        target="Sakura Park",
        reason="A quiet morning under the cherry trees.",
        valid=True,
    )
    return DecisionRecord(**{**base, **fields})


@pytest.mark.parametrize(
    "reason",
    [
        "decide what Yuto Yamamoto does next",  # the last line, copied
        "Decide what Yuto Yamamoto does next.",
        "He will go only to a place that is open now",  # a six-word span of a rule
        "70 hunger eat soon",  # most of one line's content words
        "Go home and rest energy below",
        "I can do now.",  # all of it, from "What you can do now"
    ],
)
def test_a_reason_that_copies_the_prompt_is_an_echo(reason):
    assert echo_of(reason, PROMPT)


@pytest.mark.parametrize(
    "reason",
    [
        "Yuto is hungry and the bakery smells of melon pan.",
        "Tired after work, he wants his bed.",
        "go home",  # too short to tell: two content words
        "",
    ],
)
def test_a_reason_in_its_own_words_is_not_an_echo(reason):
    assert not echo_of(reason, PROMPT)


def test_naming_an_offered_place_is_not_an_echo_but_copying_its_line_is():
    prompt = ["- go: Panya Mugi (bakery, food from 160 yen); Cafe Sora (cafe, food from 700 yen)"]
    names = frozenset({"Panya Mugi", "Cafe Sora"})
    assert not echo_of("I want melon pan at Panya Mugi.", prompt, names)
    table = ["| Sakura Park | park | always open | vending machine green tea 150 |"]
    names = frozenset({"Sakura Park", "vending machine green tea"})
    assert not echo_of("I want to buy a vending machine green tea at Sakura Park.", table, names)
    assert echo_of("I go to the food from 700 yen.", prompt, names)


def test_the_more_pressing_need_wins():
    assert pressing_need(hunger=69, energy=26) == ""
    assert pressing_need(hunger=70, energy=80) == "hunger"
    assert pressing_need(hunger=40, energy=25) == "energy"
    assert pressing_need(hunger=75, energy=5) == "energy"  # 1/6 past vs 4/5 past
    assert pressing_need(hunger=95, energy=20) == "hunger"


def test_needs_addressed_counts_only_needs_something_was_offered_for():
    records = [
        _record(hunger=80, action="go", target="Panya Mugi"),  # hungry, went for food
        _record(hunger=80, action="stay", target="Sakura Park"),  # hungry, stayed
        _record(hunger=80, money=100),  # hungry, cannot afford the bakery: nothing offered
        _record(energy=10, action="go", target="Sakura-so", options={"go": ["Sakura-so"]}),
        _record(hunger=10),  # nothing pressing
    ]
    quality = town_quality_measure(records, food=FOOD)
    assert quality.need_addressed == {"hunger": [1, 2], "energy": [1, 1]}
    assert quality.need_addressed_unnarrowed == [1, 2]  # the exhausted one was offered only home
    assert quality.need_addressed_rate == pytest.approx(2 / 3)
    assert quality.critical_rate == pytest.approx(1 / 5)  # energy 10 is exhausted


def test_variety_validity_and_echo_rate():
    records = [
        _record(action="go", target="Panya Mugi", reason="decide what Yuto Yamamoto does next"),
        _record(action="talk", target="Aoi", reason="Aoi looks lonely today."),
        _record(valid=False, action="", target="", reason="", error="output is not JSON: x"),
        _record(),
    ]
    quality = town_quality_measure(records, food=FOOD, hit_rate=0.5, median_e2e_s=1.5)
    assert quality.echo_rate == pytest.approx(1 / 3)  # of the three reasons given
    assert quality.echo_examples[0]["copies"] == "decide what yuto yamamoto does next"
    assert quality.actions == {"go": 1, "talk": 1, "stay": 1}
    assert (quality.num_distinct_actions, quality.num_talks, quality.num_places_visited) == (
        3,
        1,
        1,
    )
    assert (quality.num_invalid, quality.num_fallbacks) == (1, 1)
    assert quality.invalid_rate == pytest.approx(1 / 4)
    assert quality.errors == {"output is not JSON": 1}
    assert len(quality.samples) == 4
    assert any(s["decision"] == "(fallback: stayed put)" for s in quality.samples)
    assert dict(quality.rows())["token cache hit rate"] == "50.0%"


@pytest.mark.django_db(transaction=True)
def test_town_quality_runs_the_town_and_keeps_the_numbers_on_the_run(capsys):
    town = small_town_factory()
    call_command("town_quality", "--ticks", "1", "--town", town.name)
    out = capsys.readouterr().out
    labels = ["echo rate", "starving or exhausted", "pressing needs addressed", "distinct actions"]
    labels += ["invalid", "token cache hit rate", "sampled decisions"]
    for label in labels:
        assert label in out
    run = Run.objects.get(town=town)
    assert run.quality["num_decisions"] == run.decisions.count() > 0
    assert run.quality["samples"]
    call_command("town_quality", "--run", str(run.pk))  # measures an existing run again
    with pytest.raises(Exception, match="no run 999999"):
        call_command("town_quality", "--run", "999999")
