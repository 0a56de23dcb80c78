"""The town's rules: which actions a resident may take now, and what is wrong with one it may not.

A starving or exhausted resident is offered only the actions that answer that need (when any
does: town/rules/needs.py); the model still makes the choice among them.

The decision schema offers exactly `action_options`, so a model decoding under it cannot name a
closed or non-existent place; `action_problem` re-checks at apply time, because residents applied
earlier in the tick change the town (a place fills up, a friend walks away).
"""

from __future__ import annotations

from town.rules.needs import cheapest_food, critical_need, is_food
from town.rules.world import HOME_MEAL, ResidentView, World

ACTIONS = ("go", "stay", "buy", "eat", "talk", "rest", "work")

ACTION_HELP = {
    "go": "walk to a place that is open now (target: the place)",
    "stay": "stay where you are (target: this place)",
    "buy": "buy something here (target: the item)",
    "eat": "eat a home-cooked meal at home (target: your home)",
    "talk": "talk to someone here (target: the person)",
    "rest": "rest or sleep at home (target: your home)",
    "work": "work at your workplace while it is open (target: the workplace)",
}


def action_options(world: World, resident: ResidentView) -> dict[str, list[str]]:
    """Action → the targets it allows now, in a stable order; actions with none are left out."""
    return _narrowed_to_need(world, resident, _possible(world, resident))


def _possible(world: World, resident: ResidentView) -> dict[str, list[str]]:
    here = world.place(resident.place_id)
    here_open = here.is_open(world.clock)
    at_home = here.id == resident.home_id
    options: dict[str, list[str]] = {
        "go": [p.name for p in world.places if p.id != here.id and world.can_enter(resident, p)],
        "stay": [here.name] if here_open else [],
        "buy": [i.item for i in here.menu if i.price <= resident.money] if here_open else [],
        "eat": [here.name] if at_home and resident.money >= HOME_MEAL.price else [],
        "talk": [r.name for r in world.occupants(here.id) if r.id != resident.id],
        "rest": [here.name] if at_home else [],
        "work": [here.name] if here.id == resident.workplace_id and here_open else [],
    }
    return {action: targets for action, targets in options.items() if targets}


def _narrowed_to_need(
    world: World, resident: ResidentView, options: dict[str, list[str]]
) -> dict[str, list[str]]:
    """A starving or exhausted resident is offered only what answers that need, when anything
    does; the model still chooses among those."""
    need = critical_need(resident.hunger, resident.energy)
    if not need:
        return options
    answers = {
        action: [t for t in targets if answers_need(world, resident, need, action, t)]
        for action, targets in options.items()
    }
    answers = {action: targets for action, targets in answers.items() if targets}
    return answers or options


def answers_need(world: World, resident: ResidentView, need: str, action: str, target: str) -> bool:
    """Whether `action` on `target` (offered now) feeds a hungry resident or rests a tired one."""
    if need == "energy":
        return action == "rest" or (
            action == "go" and world.place_named(target).id == resident.home_id
        )
    if action == "eat":
        return True
    if action == "buy":
        return is_food(world.place(resident.place_id), target)
    if action == "go":
        place = world.place_named(target)
        price = cheapest_food(place, is_home=place.id == resident.home_id)
        return price is not None and price <= resident.money
    return False


def action_problem(world: World, resident: ResidentView, action: str, target: str) -> str | None:
    """Why `action` on `target` is impossible right now, or None when it is allowed."""
    if action not in ACTIONS:
        return f"unknown action {action!r}; the town knows {', '.join(ACTIONS)}"
    here = world.place(resident.place_id)
    if action == "go":
        place = world.place_named(target)
        if place is None:
            return f"there is no place called {target!r}"
        if place.id == here.id:
            return f"{resident.name} is already at {place.name}"
        if place.is_home and resident.id not in place.household_ids:
            return f"{place.name} is somebody else's home"
        if not place.is_open(world.clock):
            return f"{place.name} is closed at {world.clock.hhmm} (open {place.hours})"
        if world.is_full(place):
            return f"{place.name} is full ({place.capacity} people)"
    elif target not in _possible(world, resident).get(action, []):
        return _why_not(world, resident, action, target, here.name)
    if target not in action_options(world, resident).get(action, []):
        need = critical_need(resident.hunger, resident.energy)
        state, what = ("starving", "food") if need == "hunger" else ("exhausted", "rest")
        return f"{resident.name} is {state}: only {what} is offered now"
    return None


def _why_not(world: World, resident: ResidentView, action: str, target: str, here: str) -> str:
    place = world.place(resident.place_id)
    if action in ("stay", "buy", "work") and not place.is_open(world.clock):
        return f"{here} is closed at {world.clock.hhmm}"
    if action == "buy":
        item = place.menu_item(target)
        if item is None:
            return f"{here} does not sell {target!r}"
        return f"{target} costs ¥{item.price} but {resident.name} has ¥{resident.money}"
    if action == "talk":
        return f"{target!r} is not at {here} now"
    if action in ("rest", "eat"):
        if action == "eat" and place.id == resident.home_id:
            return (
                f"a meal at home costs ¥{HOME_MEAL.price} but {resident.name} has ¥{resident.money}"
            )
        return f"{resident.name} can {action} only at home, not at {here}"
    if action == "work":
        return f"{resident.name} does not work at {here}"
    return f"{action} {target!r} is not possible at {here}"
