"""An in-memory picture of one run's town at one moment: what prompts read and effects change.

Plain dataclasses, loaded from the database by `selectors.world_load` and written back by the
tick service, so prompts and effects are pure functions that tests can drive without a database.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from town.rules.clock import Clock, hours_label, is_open_at


@dataclass(slots=True)
class MenuItem:
    item: str
    price: int
    hunger: int = 0  # change to hunger when bought (negative: it fills you)
    energy: int = 0


# What `eat` at home costs and does: groceries for a home-cooked meal.
HOME_MEAL = MenuItem(item="home-cooked meal", price=300, hunger=-40)


@dataclass(slots=True)
class PlaceView:
    id: int
    name: str
    name_ja: str
    kind: str
    description: str
    opens_at: int
    closes_at: int
    capacity: int
    menu: list[MenuItem]
    household_ids: frozenset[int] = frozenset()  # homes: who lives there

    @property
    def is_home(self) -> bool:
        return self.kind == "home"

    @property
    def hours(self) -> str:
        return hours_label(opens_at=self.opens_at, closes_at=self.closes_at)

    def is_open(self, clock: Clock) -> bool:
        return is_open_at(
            opens_at=self.opens_at, closes_at=self.closes_at, minute_of_day=clock.minute_of_day
        )

    def menu_item(self, name: str) -> MenuItem | None:
        return next((item for item in self.menu if item.item == name), None)


@dataclass(slots=True)
class ResidentView:
    id: int
    name: str
    age: int
    occupation: str
    personality: str
    likes: list[str]
    home_id: int
    workplace_id: int | None
    wage_per_hour: int
    place_id: int
    money: int
    hunger: int
    energy: int
    visits: dict[int, int]  # place id → times visited
    memories: list[str] = field(default_factory=list)  # recent first
    diary: list[str] = field(default_factory=list)  # older days, oldest first (town/rules/diary.py)
    # (action, target) this resident carried out in the last ticks, newest first
    recent_choices: list[tuple[str, str]] = field(default_factory=list)

    def snapshot(self) -> dict:
        """The state a Decision keeps: what this resident's prompt saw."""
        return {
            "place_id": self.place_id,
            "money": self.money,
            "hunger": self.hunger,
            "energy": self.energy,
            "visits": {str(k): v for k, v in sorted(self.visits.items())},
            "memories": list(self.memories),
        }


@dataclass(slots=True)
class World:
    town_name: str
    clock: Clock
    minutes_per_tick: int
    places: list[PlaceView]  # in id order
    residents: list[ResidentView]  # in id order

    def place(self, place_id: int) -> PlaceView:
        return next(p for p in self.places if p.id == place_id)

    def place_named(self, name: str) -> PlaceView | None:
        return next((p for p in self.places if p.name == name), None)

    def resident(self, resident_id: int) -> ResidentView:
        return next(r for r in self.residents if r.id == resident_id)

    def resident_named(self, name: str) -> ResidentView | None:
        return next((r for r in self.residents if r.name == name), None)

    def occupants(self, place_id: int) -> list[ResidentView]:
        return [r for r in self.residents if r.place_id == place_id]

    def is_full(self, place: PlaceView) -> bool:
        return len(self.occupants(place.id)) >= place.capacity

    def open_places(self) -> list[PlaceView]:
        return [p for p in self.places if p.is_open(self.clock)]

    def can_enter(self, resident: ResidentView, place: PlaceView) -> bool:
        """Open, not somebody else's home, and a place in it kept for this resident."""
        if place.is_home and resident.id not in place.household_ids:
            return False
        return place.is_open(self.clock) and self.has_room_for(resident, place)

    def has_room_for(self, resident: ResidentView, place: PlaceView) -> bool:
        """Whether a place stays free for this resident even if everyone ahead of them walks in
        during the same tick: every resident decides at once, so a café with two free seats is
        offered to the two residents who need it most (hungriest, then most tired), not to all
        ten, eight of whom would find it full. A home fits its household."""
        free = place.capacity - len(self.occupants(place.id))
        if place.is_home or free <= 0:
            return free > 0
        ahead = [
            r
            for r in self.residents
            if r.place_id != place.id and _neediness(r) < _neediness(resident)
        ]
        return len(ahead) < free


def _neediness(resident: ResidentView) -> tuple[int, int, int]:
    """The order in which residents are offered the last free places: hungriest first."""
    return (-resident.hunger, resident.energy, resident.id)
