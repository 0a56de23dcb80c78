"""The town's rules and effects on a small in-memory World (no database)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import xgrammar as xgr

from town.rules.actions import action_options, action_problem
from town.rules.clock import Clock, is_open_at
from town.rules.effects import action_apply, time_passes
from town.rules.schema import REASON_SCHEMA_MAX_CHARS, decision_schema
from town.rules.world import MenuItem, PlaceView, ResidentView, World

HOME, CAFE, BAKERY, BAR = 1, 2, 3, 4


def _place(pid, name, kind, opens, closes, capacity, menu=(), household=()):
    return PlaceView(
        id=pid, name=name, name_ja="", kind=kind, description="", opens_at=opens,
        closes_at=closes, capacity=capacity, menu=list(menu), household_ids=frozenset(household),
    )  # fmt: skip


def _resident(rid, name, place_id=HOME, money=1000, **fields):
    return ResidentView(
        id=rid, name=name, age=30, occupation="x", personality="y", likes=[], home_id=HOME,
        workplace_id=fields.pop("workplace_id", None), wage_per_hour=fields.pop("wage", 0),
        place_id=place_id, money=money, hunger=fields.pop("hunger", 50),
        energy=fields.pop("energy", 50), visits=fields.pop("visits", {HOME: 3}),
    )  # fmt: skip


@pytest.fixture
def world() -> World:
    """09:00: home (1, 2 and 3 live there), a café 8-20 for two, a bakery 7-18, a bar 17-01."""
    places = [
        _place(HOME, "Home", "home", 0, 0, 6, household=(1, 2, 3)),
        _place(CAFE, "Cafe", "cafe", 8 * 60, 20 * 60, 2, [MenuItem("latte", 500, -5, 10)]),
        _place(BAKERY, "Bakery", "bakery", 7 * 60, 18 * 60, 4, [MenuItem("melon pan", 180, -20)]),
        _place(BAR, "Bar", "izakaya", 17 * 60, 60, 8, [MenuItem("beer", 500)]),
    ]
    residents = [
        _resident(1, "Aki", workplace_id=BAKERY, wage=1200),
        _resident(2, "Ben", money=100),
        _resident(3, "Chie", place_id=CAFE, visits={HOME: 3, CAFE: 2}),
        _resident(4, "Dai", place_id=CAFE),  # lives elsewhere
    ]
    return World("T", Clock(9 * 60), 60, places, residents)


def test_opening_hours_wrap_past_midnight():
    assert is_open_at(opens_at=17 * 60, closes_at=60, minute_of_day=23 * 60)
    assert is_open_at(opens_at=17 * 60, closes_at=60, minute_of_day=30)
    assert not is_open_at(opens_at=17 * 60, closes_at=60, minute_of_day=12 * 60)
    assert is_open_at(opens_at=0, closes_at=0, minute_of_day=3 * 60)
    assert Clock(9 * 60).phase == "morning" and Clock(22 * 60).phase == "night"
    assert Clock(24 * 60 + 12 * 60).label() == "Day 2, 12:00 (noon)"


def test_options_offer_only_what_is_possible_now(world):
    aki = world.resident(1)
    options = action_options(world, aki)
    assert options["go"] == ["Bakery"]  # the café is full (2/2), the bar is closed
    assert options["stay"] == ["Home"] and options["rest"] == ["Home"]
    assert options["talk"] == ["Ben"]
    assert "buy" not in options and "work" not in options
    chie = world.resident(3)
    assert action_options(world, chie)["buy"] == ["latte"]
    assert action_options(world, chie)["go"] == ["Home", "Bakery"]
    assert "Home" not in action_options(world, world.resident(4))["go"]  # not Dai's home


def test_schema_admits_exactly_the_options(world):
    schema = decision_schema(action_options(world, world.resident(1)))
    jsonschema.validate(
        {"action": "go", "target": "Bakery", "reason": "I want fresh bread."}, schema
    )
    for bad in [
        {"action": "go", "target": "Cafe", "reason": "I like it."},
        {"action": "go", "target": "Bar", "reason": "I like it."},
        {"action": "talk", "target": "Bakery", "reason": "I am mixed up."},
        {"action": "go", "target": "Bakery", "reason": "I " + "x" * REASON_SCHEMA_MAX_CHARS + "."},
        {"action": "go", "target": "Bakery", "reason": 'I quote " here.'},
        {"action": "go", "target": "Bakery", "reason": "Decide what Ann does next"},
        {"action": "go", "target": "Bakery"},
    ]:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    # xgrammar compiles it, so the engine can decode under it.
    xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)


def test_go_moves_counts_the_visit_and_remembers_it(world):
    aki = world.resident(1)
    assert action_problem(world, aki, "go", "Bakery") is None
    notes = action_apply(world, aki, "go", "Bakery", "bread")
    assert aki.place_id == BAKERY and aki.visits[BAKERY] == 1 and aki.energy == 47
    assert notes == [(1, "Went from Home to Bakery (first visit).")]
    action_apply(world, aki, "go", "Home", "")
    notes = action_apply(world, aki, "go", "Bakery", "")
    assert notes == [(1, "Went from Home to Bakery (visit number 2).")]


def test_the_last_free_places_are_offered_to_the_neediest_only(world):
    """The bakery (room for 4) holds two people: its two free places go to the two hungriest
    of those who could walk in, since every resident decides in the same tick."""
    world.resident(3).place_id = world.resident(4).place_id = BAKERY  # the café empties
    world.places[2].capacity = 3  # the bakery: one free place
    aki, ben = world.resident(1), world.resident(2)
    ben.hunger = 70
    assert "Bakery" in action_options(world, ben)["go"]
    assert "Bakery" not in action_options(world, aki)["go"]
    assert "kept for residents who need them more" in action_problem(world, aki, "go", "Bakery")
    action_apply(world, ben, "go", "Bakery", "")  # Ben takes it: the bakery is full
    assert action_problem(world, aki, "go", "Bakery") == "Bakery is full (3 people)"
    world.places[2].capacity = 5  # two free places: Aki is next in line
    assert action_problem(world, aki, "go", "Bakery") is None


@pytest.mark.parametrize(
    ("rid", "action", "target", "problem"),
    [
        (1, "go", "Cafe", "Cafe is full (2 people)"),
        (1, "go", "Bar", "Bar is closed at 09:00 (open 17-1)"),
        (1, "go", "Castle", "there is no place called 'Castle'"),
        (1, "go", "Home", "Aki is already at Home"),
        (4, "go", "Home", "Home is somebody else's home"),
        (3, "buy", "croissant", "Cafe does not sell 'croissant'"),
        (1, "talk", "Dai", "'Dai' is not at Home now"),
        (3, "rest", "Cafe", "Chie can rest only at home, not at Cafe"),
        (3, "work", "Cafe", "Chie does not work at Cafe"),
        (1, "fly", "Cafe", "unknown action 'fly'"),
    ],
)
def test_impossible_actions_say_why(world, rid, action, target, problem):
    assert problem in action_problem(world, world.resident(rid), action, target)


def test_buy_spends_money_and_feeds(world):
    chie = world.resident(3)
    notes = action_apply(world, chie, "buy", "latte", "")
    assert (chie.money, chie.hunger, chie.energy) == (500, 45, 60)
    assert notes == [(3, "Bought latte at Cafe for ¥500.")]
    action_apply(world, chie, "buy", "latte", "")
    assert chie.money == 0
    assert "costs ¥500 but Chie has ¥0" in action_problem(world, chie, "buy", "latte")


def test_talk_is_remembered_by_both_without_quoting_it(world):
    notes = action_apply(world, world.resident(3), "talk", "Dai", "I love this nice weather.")
    assert notes == [
        (3, "Talked with Dai at Cafe."),
        (4, "Chie came to talk with me at Cafe."),
    ]


def test_work_rest_and_time(world):
    aki = world.resident(1)
    action_apply(world, aki, "rest", "Home", "")
    assert aki.energy == 65
    action_apply(world, aki, "go", "Bakery", "")
    assert action_options(world, aki)["work"] == ["Bakery"]
    action_apply(world, aki, "work", "Bakery", "")
    assert aki.money == 2200 and aki.energy == 60
    time_passes(world)
    assert (aki.hunger, aki.energy) == (55, 57)
    world.resident(2).hunger = 99
    time_passes(world)
    assert world.resident(2).hunger == 100  # bounded


def test_a_full_resident_is_offered_no_food(world):
    aki = world.resident(1)
    aki.place_id, aki.hunger = BAKERY, 20
    assert "buy" not in action_options(world, aki)
    assert "is full (hunger 20)" in action_problem(world, aki, "buy", "melon pan")
    chie = world.resident(3)  # at the café: a latte is a drink, not food
    chie.hunger = 10
    assert action_options(world, chie)["buy"] == ["latte"]
    aki.place_id = HOME
    assert "eat" not in action_options(world, aki)
    assert "no meal now" in action_problem(world, aki, "eat", "Home")


def test_a_resident_at_home_can_eat_a_meal_they_can_afford(world):
    aki, ben = world.resident(1), world.resident(2)  # ¥1000 and ¥100, both at home
    assert action_options(world, aki)["eat"] == ["Home"]
    assert "eat" not in action_options(world, ben)
    assert "300" in action_problem(world, ben, "eat", "Home")
    notes = action_apply(world, aki, "eat", "Home", "")
    assert (aki.money, aki.hunger) == (700, 10) and "ate a meal" in notes[0][1]
    assert "only at home" in action_problem(world, world.resident(3), "eat", "Home")


def test_a_starving_or_exhausted_resident_is_offered_only_what_answers_the_need(world):
    aki = world.resident(1)
    aki.hunger = 95  # at home, where a meal answers it: no walk to the bakery
    assert action_options(world, aki) == {"eat": ["Home"]}
    assert action_problem(world, aki, "talk", "Ben") == "Aki is starving: only food is offered now"
    aki.hunger, aki.energy = 50, 5
    assert action_options(world, aki) == {"rest": ["Home"]}
    chie = world.resident(3)  # at the café, where nothing is food
    chie.hunger = 95
    assert action_options(world, chie) == {"go": ["Home", "Bakery"]}
    chie.hunger, chie.money = 95, 100  # can afford nothing: nothing answers, all is offered
    assert "stay" in action_options(world, chie)
    aki.energy = 22  # tired, not exhausted: the whole menu
    assert "talk" in action_options(world, aki)
    aki.energy, aki.money = 50, 200  # very hungry, too little for a meal at home: walk to food
    aki.hunger = 76
    assert action_options(world, aki) == {"go": ["Bakery"]}


def test_a_resident_who_must_eat_and_finds_food_here_is_not_sent_on(world):
    aki = world.resident(1)
    aki.place_id, aki.hunger = BAKERY, 80
    assert action_options(world, aki) == {"buy": ["melon pan"]}
    assert "only food" in action_problem(world, aki, "go", "Home")
    aki.place_id, aki.hunger, aki.energy = HOME, 40, 18  # must rest, at home: rest here
    assert action_options(world, aki) == {"rest": ["Home"]}


def test_a_tired_resident_away_from_home_is_sent_home_before_exhausted(world):
    chie = world.resident(3)  # at the café: the walk home and a turn awake cost ~9 energy
    chie.energy = 24
    assert action_options(world, chie) == {"go": ["Home"]}
    chie.energy = 30  # a little tired: the whole menu
    assert "talk" in action_options(world, chie)
    aki = world.resident(1)  # at home, as tired: rest is right here, nothing is narrowed yet
    aki.energy = 24
    assert "talk" in action_options(world, aki)


def test_a_walk_to_food_that_closes_before_the_next_turn_does_not_answer_hunger(world):
    aki = world.resident(1)
    aki.hunger, aki.money = 80, 200  # too little for a meal at home; the bakery's 180 is fine
    assert action_options(world, aki) == {"go": ["Bakery"]}
    world.clock = Clock(17 * 60 + 30)  # the bakery closes at 18:00, before her next turn
    options = action_options(world, aki)
    assert "Bakery" in options["go"] and "talk" in options  # nothing answers: the whole menu


def test_a_choice_made_twice_in_a_row_without_cause_is_left_out_next_time(world):
    aki = world.resident(1)  # at home, hunger 50, energy 50
    aki.recent_choices = [("talk", "Ben"), ("talk", "Ben")]
    assert "talk" not in action_options(world, aki)
    assert "the last 2 ticks" in action_problem(world, aki, "talk", "Ben")
    chie = world.resident(3)  # at the café: buying something else is still buying
    chie.recent_choices = [("buy", "latte"), ("buy", "espresso")]
    assert "buy" not in action_options(world, chie)
    chie.recent_choices = [("go", "Cafe"), ("go", "Bar")]  # walking on and on is one too
    assert "go" not in action_options(world, chie)
    chie.hunger = 72  # ... unless it takes her to food
    assert action_options(world, chie)["go"] == ["Home", "Bakery"]  # both feed her
    aki.recent_choices = [("talk", "Ben"), ("stay", "Home")]  # not the same twice
    assert action_options(world, aki)["talk"] == ["Ben"]
    aki.recent_choices = [("rest", "Home"), ("rest", "Home")]  # resting again has a cause
    assert action_options(world, aki)["rest"] == ["Home"]
    aki.energy = 90  # ... until rested
    assert "rest" not in action_options(world, aki)
    aki.energy = 50
    aki.recent_choices, aki.hunger = [("eat", "Home"), ("eat", "Home")], 72  # still hungry
    assert action_options(world, aki)["eat"] == ["Home"]


def test_a_pressing_needs_answers_are_listed_first(world):
    aki = world.resident(1)
    aki.hunger = 72  # hungry, not starving: the whole menu, food first
    options = action_options(world, aki)
    assert list(options)[:2] == ["go", "eat"] and options["go"] == ["Bakery"]
    assert "talk" in options
    aki.hunger, aki.energy = 30, 22  # tired
    assert next(iter(action_options(world, aki))) == "rest"
