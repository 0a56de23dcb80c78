"""The town's rules: which actions a resident may take now, and what is wrong with one it may not.

A resident who must eat or rest now is offered only the actions that answer that need (when any
does: town/rules/needs.py), and only those right here when there are any (a walk elsewhere costs
a turn); a walk to food answers hunger only if the place is still open at the next turn, when
the food can be bought; a pressing need's answers are listed first; a full resident is not
offered food; and an action taken REPEAT_TICKS ticks in a row without cause (not work, not
rest while below RESTED energy, not answering a pressing need) is left out the next time:
walking on from place to place every turn is a loop too.
The model still makes the choice among what is offered.

The decision schema offers exactly `action_options`, so a model decoding under it cannot name a
closed or non-existent place. Every resident decides at once, so a place with few free places
left is offered only to as many residents as it can still take (`World.has_room_for`, the
neediest first); `action_problem` re-checks at apply time, because residents applied earlier in
the tick change the town (a friend walks away, somebody's meal makes them less hungry).
"""

from __future__ import annotations

from town.rules.clock import Clock
from town.rules.needs import FULL, cheapest_food, critical_need, is_food, pressing_need
from town.rules.world import HOME_MEAL, PlaceView, ResidentView, World

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


REPEAT_TICKS = 2
_REPEATABLE = ("work",)
RESTED = 60  # resting on and on is a loop once energy is at least this


def action_options(world: World, resident: ResidentView) -> dict[str, list[str]]:
    """Action → the targets it allows now, in a stable order; actions with none are left out."""
    options = _without_repeats(world, resident, _possible(world, resident))
    return _need_first(world, resident, _narrowed_to_need(world, resident, options))


def _without_repeats(
    world: World, resident: ResidentView, options: dict[str, list[str]]
) -> dict[str, list[str]]:
    """Leave out the action taken in each of the last REPEAT_TICKS ticks (whatever its target:
    buying something else at the same counter, or walking on to yet another place, is still the
    same loop), unless it is work, rest while not yet rested, or answers a pressing need now (or
    nothing else would be left)."""
    recent = resident.recent_choices[:REPEAT_TICKS]
    actions = {action for action, _ in recent}
    if len(recent) < REPEAT_TICKS or len(actions) != 1:
        return options
    action = actions.pop()
    if action in _REPEATABLE or (action == "rest" and resident.energy < RESTED):
        return options
    need = pressing_need(resident.hunger, resident.energy)
    if need and any(
        answers_need(world, resident, need, action, t) for t in options.get(action, [])
    ):
        return options
    kept = {a: ts for a, ts in options.items() if a != action}
    return kept or options


def _need_first(
    world: World, resident: ResidentView, options: dict[str, list[str]]
) -> dict[str, list[str]]:
    """With a pressing need, the actions and targets that answer it come first."""
    need = pressing_need(resident.hunger, resident.energy)
    if not need:
        return options

    def answers(action: str, target: str) -> bool:
        return answers_need(world, resident, need, action, target)

    ordered = {
        action: sorted(targets, key=lambda t, a=action: not answers(a, t))
        for action, targets in options.items()
    }
    return dict(sorted(ordered.items(), key=lambda item: not answers(item[0], item[1][0])))


def _possible(world: World, resident: ResidentView) -> dict[str, list[str]]:
    here = world.place(resident.place_id)
    here_open = here.is_open(world.clock)
    at_home = here.id == resident.home_id
    options: dict[str, list[str]] = {
        "go": [p.name for p in world.places if p.id != here.id and world.can_enter(resident, p)],
        "stay": [here.name] if here_open else [],
        "buy": [i.item for i in here.menu if _buyable(here, i.item, resident)] if here_open else [],
        "eat": [here.name] if at_home and _can_eat(resident, HOME_MEAL.price) else [],
        "talk": [r.name for r in world.occupants(here.id) if r.id != resident.id],
        "rest": [here.name] if at_home else [],
        "work": [here.name] if here.id == resident.workplace_id and here_open else [],
    }
    return {action: targets for action, targets in options.items() if targets}


def _can_eat(resident: ResidentView, price: int) -> bool:
    return resident.hunger >= FULL and price <= resident.money


def _buyable(place: PlaceView, item: str, resident: ResidentView) -> bool:
    """Affordable, and not food for a resident who is full."""
    found = place.menu_item(item)
    if found is None or found.price > resident.money:
        return False
    return resident.hunger >= FULL or not is_food(place, item)


def _narrowed_to_need(
    world: World, resident: ResidentView, options: dict[str, list[str]]
) -> dict[str, list[str]]:
    """A starving or exhausted resident is offered only what answers that need, when anything
    does; the model still chooses among those."""
    need = critical_need(
        resident.hunger, resident.energy, at_home=resident.place_id == resident.home_id
    )
    if not need:
        return options
    answers = {
        action: [t for t in targets if answers_need(world, resident, need, action, t)]
        for action, targets in options.items()
    }
    answers = {action: targets for action, targets in answers.items() if targets}
    if any(action != "go" for action in answers):
        # Food or rest right here: walking on to another place that has it is a tick lost.
        answers.pop("go", None)
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
        is_home = place.id == resident.home_id
        price = cheapest_food(place, is_home=is_home)
        # A walk to food is an answer when the food can be bought there: buying is the next
        # turn, so the place must still be open then (a café that closes meanwhile is not).
        return (
            price is not None and price <= resident.money and (is_home or _open_next(world, place))
        )
    return False


def _open_next(world: World, place: PlaceView) -> bool:
    return place.is_open(Clock(world.clock.minutes + world.minutes_per_tick))


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
        if not world.has_room_for(resident, place):
            return f"{place.name}'s last free places are kept for residents who need them more"
    elif target not in _possible(world, resident).get(action, []):
        return _why_not(world, resident, action, target, here.name)
    if target in action_options(world, resident).get(action, []):
        return None
    need = critical_need(
        resident.hunger, resident.energy, at_home=resident.place_id == resident.home_id
    )
    if need:
        state, what = ("starving", "food") if need == "hunger" else ("exhausted", "rest")
        return f"{resident.name} is {state}: only {what} is offered now"
    return f"{resident.name} did {action} the last {REPEAT_TICKS} ticks: something else now"


def _why_not(world: World, resident: ResidentView, action: str, target: str, here: str) -> str:
    place = world.place(resident.place_id)
    if action in ("stay", "buy", "work") and not place.is_open(world.clock):
        return f"{here} is closed at {world.clock.hhmm}"
    if action == "buy":
        item = place.menu_item(target)
        if item is None:
            return f"{here} does not sell {target!r}"
        if item.price <= resident.money:
            return f"{resident.name} is full (hunger {resident.hunger}): no food now"
        return f"{target} costs ¥{item.price} but {resident.name} has ¥{resident.money}"
    if action == "talk":
        return f"{target!r} is not at {here} now"
    if action in ("rest", "eat"):
        if action == "eat" and place.id == resident.home_id:
            if resident.hunger < FULL:
                return f"{resident.name} is full (hunger {resident.hunger}): no meal now"
            return (
                f"a meal at home costs ¥{HOME_MEAL.price} but {resident.name} has ¥{resident.money}"
            )
        return f"{resident.name} can {action} only at home, not at {here}"
    if action == "work":
        return f"{resident.name} does not work at {here}"
    return f"{action} {target!r} is not possible at {here}"
