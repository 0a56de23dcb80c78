"""Hunger and energy in words, which need presses most, and what answers it.

One definition for the prompt (needs said in words), the menu of actions (a starving or
exhausted resident is offered only what answers that need, when something does) and the
quality measures (town/quality.py: was the pressing need addressed when it could be).
Hunger runs 0 (full) .. 100 (starving); energy 0 (exhausted) .. 100 (rested).
"""

from __future__ import annotations

from town.rules.world import HOME_MEAL, PlaceView

FULL = 30  # below this hunger, nobody is offered food
HUNGRY, STARVING = 70, 90
TIRED, EXHAUSTED = 25, 10
# From here on the menu holds only what answers the need (when anything does): before the
# resident is starving or exhausted, so that one tick's walk to food or home comes in time.
MUST_EAT, MUST_REST = 75, 20
# Away from home, rest is a walk and a turn away: a tired resident out must head home now, or
# arrives exhausted (a walk and two hours awake cost about 9 energy).
MUST_REST_AWAY = TIRED
FOOD_MIN_HUNGER = 15  # an item that lowers hunger by at least this much is food


def pressing_need(hunger: int, energy: int) -> str:
    """'hunger', 'energy' or '' (neither is pressing); when both, the one further past its
    threshold (hunger over 30 points to 100, energy over 25 points to 0)."""
    hungry = (hunger - HUNGRY) / (100 - HUNGRY) if hunger >= HUNGRY else -1.0
    tired = (TIRED - energy) / TIRED if energy <= TIRED else -1.0
    if hungry < 0 and tired < 0:
        return ""
    return "hunger" if hungry >= tired else "energy"


def critical_need(hunger: int, energy: int, *, at_home: bool = True) -> str:
    """The need that must be met now (MUST_EAT; MUST_REST at home, MUST_REST_AWAY elsewhere),
    else ''; when both must, the pressing one."""
    hungry = hunger >= MUST_EAT
    tired = energy <= (MUST_REST if at_home else MUST_REST_AWAY)
    if hungry and tired:
        return pressing_need(hunger, energy) or "hunger"
    return "hunger" if hungry else "energy" if tired else ""


# A need in one or two words, not a phrase: "hungry: should eat soon" came back as the reason
# ("I am hungry and should eat soon"); what to do about it is the menu's job (narrowed, and the
# need's answers listed first) and rule 6's.
def hunger_words(hunger: int) -> str:
    if hunger >= STARVING:
        return "starving"
    if hunger >= MUST_EAT:
        return "very hungry"
    if hunger >= HUNGRY:
        return "hungry"
    if hunger >= FULL:
        return "a little hungry"
    return "full"


def energy_words(energy: int) -> str:
    if energy <= EXHAUSTED:
        return "exhausted"
    if energy <= MUST_REST:
        return "very tired"
    if energy <= TIRED:
        return "tired"
    if energy <= 50:
        return "a little tired"
    return "rested"


def cheapest_food(place: PlaceView, *, is_home: bool) -> int | None:
    """The price of the cheapest food a resident finds at `place` (their home: a meal)."""
    if is_home:
        return HOME_MEAL.price
    prices = [i.price for i in place.menu if -i.hunger >= FOOD_MIN_HUNGER]
    return min(prices, default=None)


def is_food(place: PlaceView, item: str) -> bool:
    found = place.menu_item(item)
    return found is not None and -found.hunger >= FOOD_MIN_HUNGER
