"""Factories for the town's models: each makes a valid object with overridable fields."""

from __future__ import annotations

from itertools import count

from town import services
from town.models import Place, Resident, Run, Town

_serial = count(1)


def town_factory(**fields) -> Town:
    return Town.objects.create(**{"name": f"Testmachi {next(_serial)}", **fields})


def place_factory(*, town: Town, **fields) -> Place:
    defaults = {
        "name": f"Place {next(_serial)}",
        "kind": Place.Kind.CAFE,
        "x": 10,
        "y": 10,
        "opens_at": 8 * 60,
        "closes_at": 20 * 60,
        "capacity": 4,
        "menu": [{"item": "latte", "price": 500, "hunger": -5, "energy": 10}],
    }
    return Place.objects.create(town=town, **{**defaults, **fields})


def home_factory(*, town: Town, **fields) -> Place:
    fields = {"kind": Place.Kind.HOME, "opens_at": 0, "closes_at": 0, "menu": [], **fields}
    return place_factory(town=town, **fields)


def resident_factory(*, town: Town, home: Place, **fields) -> Resident:
    defaults = {
        "name": f"Resident {next(_serial)}",
        "age": 30,
        "occupation": "tester",
        "personality": "careful",
        "likes": ["cafe"],
        "money": 1000,
        "hunger": 20,
        "energy": 80,
        "visits": {str(home.id): 10},
    }
    return Resident.objects.create(town=town, home=home, **{**defaults, **fields})


def small_town_factory() -> Town:
    """Two homes, a café (8-20, room for 2), a bakery (7-18), a park; four residents."""
    town = town_factory()
    home_a = home_factory(town=town, name="Home A")
    home_b = home_factory(town=town, name="Home B")
    place_factory(town=town, name="Cafe", capacity=2)
    place_factory(
        town=town,
        name="Bakery",
        kind=Place.Kind.BAKERY,
        opens_at=7 * 60,
        closes_at=18 * 60,
        menu=[{"item": "melon pan", "price": 180, "hunger": -20, "energy": 0}],
    )
    place_factory(town=town, name="Park", kind=Place.Kind.PARK, opens_at=0, closes_at=0, menu=[])
    for name, home in [("Aki", home_a), ("Ben", home_a), ("Chie", home_b), ("Dai", home_b)]:
        resident_factory(town=town, home=home, name=name)
    return town


def run_factory(*, town: Town, **fields) -> Run:
    return services.run_create(town=town, **fields)
