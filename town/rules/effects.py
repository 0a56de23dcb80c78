"""What an allowed action does to the town, and what every tick does to everyone.

Functions change a World in place and return the memories they create as (resident id, text);
the tick service stores both. Bounds: hunger and energy stay within 0..100.
"""

from __future__ import annotations

from town.rules.world import HOME_MEAL, ResidentView, World

Note = tuple[int, str]

HUNGER_PER_HOUR = 5
ENERGY_PER_HOUR = 3
REST_ENERGY_PER_HOUR = 15
WORK_ENERGY_PER_HOUR = 2
GO_ENERGY = 3


def _clamp(value: float) -> int:
    return max(0, min(100, round(value)))


def _hours(world: World) -> float:
    return world.minutes_per_tick / 60


def action_apply(
    world: World, resident: ResidentView, action: str, target: str, reason: str
) -> list[Note]:
    """Apply an action that `action_problem` allowed; returns the memories it creates."""
    here = world.place(resident.place_id)
    if action == "go":
        place = world.place_named(target)
        assert place is not None, "go was validated before it was applied"
        resident.place_id = place.id
        resident.energy = _clamp(resident.energy - GO_ENERGY)
        times = resident.visits.get(place.id, 0) + 1
        resident.visits[place.id] = times
        visit = "first visit" if times == 1 else f"visit number {times}"
        return [(resident.id, f"Went from {here.name} to {place.name} ({visit}).")]
    if action == "stay":
        return [(resident.id, f"Stayed at {here.name}.")]
    if action == "buy":
        item = here.menu_item(target)
        assert item is not None, "buy was validated before it was applied"
        resident.money -= item.price
        resident.hunger = _clamp(resident.hunger + item.hunger)
        resident.energy = _clamp(resident.energy + item.energy)
        return [(resident.id, f"Bought {item.item} at {here.name} for ¥{item.price}.")]
    if action == "eat":
        resident.money -= HOME_MEAL.price
        resident.hunger = _clamp(resident.hunger + HOME_MEAL.hunger)
        return [(resident.id, f"Cooked and ate a meal at home ({here.name}).")]
    if action == "talk":
        other = world.resident_named(target)
        assert other is not None, "talk was validated before it was applied"
        # What was said is not quoted into the memories: they are in both residents' next
        # prompts, and a small model copies a quoted sentence as its own next reason (run 12 in
        # docs/TOWN.md: 5 of 13 echoes repeated one talk). The decision keeps the reason.
        return [
            (resident.id, f"Talked with {other.name} at {here.name}."),
            (other.id, f"{resident.name} came to talk with me at {here.name}."),
        ]
    if action == "rest":
        resident.energy = _clamp(resident.energy + REST_ENERGY_PER_HOUR * _hours(world))
        return [(resident.id, f"Rested at home ({here.name}).")]
    if action == "work":
        earned = round(resident.wage_per_hour * _hours(world))
        resident.money += earned
        resident.energy = _clamp(resident.energy - WORK_ENERGY_PER_HOUR * _hours(world))
        return [(resident.id, f"Worked at {here.name} and earned ¥{earned}.")]
    raise AssertionError(f"action {action!r} was validated before it was applied")


def time_passes(world: World) -> None:
    """Everyone gets hungrier and more tired as a tick's time goes by."""
    hours = _hours(world)
    for resident in world.residents:
        resident.hunger = _clamp(resident.hunger + HUNGER_PER_HOUR * hours)
        resident.energy = _clamp(resident.energy - ENERGY_PER_HOUR * hours)
