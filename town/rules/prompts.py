"""Prompts for one decision, in the three layouts of the talk's steps.

- `naive`: the rules addressed to the resident and mixed with their state, the place list after
  it (annotated per resident: first visit or returning), the output format spelled out in the
  body as well as in the schema. Nothing two residents share comes first.
- `shared_rules`: the rules, the output format and the list of places (no menus) at the head,
  the same for every resident; the shops' menus and prices stay in each resident's part, as in
  `naive` (the talk's steps 2–3, before the shop info moved to the head).
- `shared_head`: the rules, then the places as one table — the same for every resident in every
  tick — then the tick's situation (clock, what is open, who is where: the same for every
  resident in this tick), then the resident. Each shared message carries `"cache": True`: a
  cache breakpoint where a shared section ends.
- `shared_head_schema_only`: as `shared_head`, with the output format only in the JSON schema.
- `shared_then_resident_head`: two cached heads. The shared head (rules and the places table:
  the same for every resident in every tick), then the resident's own head (profile and diary:
  the same for this resident in every tick, `"scope": "resident"` on its breakpoint), then what
  changes each tick (the situation, the resident's state, known places, memories, options).
  The output format is only in the schema. From the second tick on, a decision reuses the
  shared head and the resident's own head (most of a long prompt: the diary) from the
  resident's previous decision; the tick's situation, no longer at the head, is not shared.

A message marked `"cache": True` ends in a cache breakpoint. The shared head is the messages up
to the last breakpoint without `"scope": "resident"`: nothing per resident may enter it
(tests/town/test_prompts.py checks it with the real tokenizer); the experiment warms and pins
it per tick, and the admin shows it apart from the rest.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from town.rules.actions import action_options
from town.rules.effects import REST_ENERGY_PER_HOUR
from town.rules.needs import cheapest_food, energy_words, hunger_words
from town.rules.schema import REASON_MAX_CHARS, decision_schema
from town.rules.world import HOME_MEAL, PlaceView, ResidentView, World

LAYOUTS = (
    "naive",
    "shared_rules",
    "shared_head",
    "shared_head_schema_only",
    "shared_then_resident_head",
)

_INTRO = (
    "Pokomachi (ぽこまち) is a small Japanese town. Each turn is {minutes} minutes of town time; "
    "in each turn every resident takes one action. Below: the town's rules and places, then one "
    "resident's profile, state and memories, and the actions open to them this turn."
)

_RULES = """\
Rules of the town:
1. Go only to a place that is open now and not full. A home is private: only the people who \
live there may enter it, and it is always open to them.
2. A shop sells the items on its menu at the listed price in yen. Nobody can spend more money \
than they have.
3. Food lowers hunger (0 is full, 100 is starving); at home a resident can eat a home-cooked \
meal for 300 yen. Resting at home restores energy (100 is fully rested). Working at your own \
workplace while it is open earns your hourly wage.
4. Talk only to someone at the same place as you. Both of you will remember the talk.
5. Stay in character: follow the resident's personality, likes and memories. Curious people \
try places they do not know yet; creatures of habit return to their favourites.
6. A hungry resident eats; a tired one goes home and rests. Late at night most people are at \
home asleep; shops close and open again in the morning.
7. Do not repeat the same action forever: a day has work, meals, errands, friends and rest."""

# Worked examples, in the shared (cached) head: residents of another town, so that a reason
# copied from here is seen as an echo, never mistaken for a resident's own.
_EXAMPLES = """\
How residents of another town decided (each answer is the resident's own short thought):
- Mika at the bakery, hungry, 900 yen; offered: buy anpan (160 yen, hunger -20), go, talk.
  {"action": "buy", "target": "anpan", "reason": "I skipped breakfast and anpan sounds perfect."}
- Taro at home at 23:00, tired; offered: rest (energy +30), eat, talk.
  {"action": "rest", "target": "Hill House", "reason": "I can barely keep my eyes open."}
- Emi at the cafe, rested and full, a friend here; offered: talk Ken, go, stay.
  {"action": "talk", "target": "Ken", "reason": "I missed Ken while he was away in Osaka."}"""

_FORMAT = (
    "Answer with one JSON object and nothing else, with exactly these keys in this order:\n"
    '{{"action": ..., "target": ..., "reason": ...}}\n'
    "- action (required): one of go, stay, buy, eat, talk, rest, work; only an action listed "
    'under "Options".\n'
    "- target (required): exactly one of the options listed for that action, spelled as listed.\n"
    "- reason (required): the resident's own thought, one short sentence in the first person, "
    'starting with "I" and ending with a full stop, at most {chars} characters, in your own '
    "words, with no numbers."
)


def num_shared_messages(messages: list[dict[str, Any]]) -> int:
    """How many leading messages make the shared head: up to and including the last cache
    breakpoint that is not one resident's own (`"scope": "resident"`)."""
    return max(
        (
            i + 1
            for i, m in enumerate(messages)
            if m.get("cache") and m.get("scope", "shared") == "shared"
        ),
        default=0,
    )


@dataclass(frozen=True, slots=True)
class Prompt:
    # Chat messages; a section that ends in a cache breakpoint carries "cache": True, and
    # "scope": "resident" when it is one resident's own (not shared with the others).
    messages: list[dict[str, Any]]
    json_schema: dict[str, Any]

    @property
    def head_messages(self) -> list[dict[str, Any]]:
        """The shared head: the messages up to and including its last cache breakpoint."""
        return self.messages[: num_shared_messages(self.messages)]

    @property
    def prompt_hash(self) -> str:
        return _hash(self.messages)

    @property
    def head_hash(self) -> str:
        head = self.head_messages
        return _hash(head) if head else ""


def _hash(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def prompt_build(*, world: World, resident: ResidentView, layout: str) -> Prompt:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown prompt layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    options = action_options(world, resident)
    schema = decision_schema(options)
    if layout == "naive":
        return Prompt(messages=_naive_messages(world, resident, options), json_schema=schema)
    if layout == "shared_then_resident_head":
        return Prompt(messages=_two_head_messages(world, resident, options), json_schema=schema)
    if layout == "shared_rules":
        head = shared_rules_text(world)
        tail = resident_text(world, resident, options, shop_info=True)
    else:
        head = shared_head_text(world, with_format=layout == "shared_head")
        tail = resident_text(world, resident, options)
    messages = [
        {"role": "system", "content": head, "cache": True},
        {"role": "system", "content": situation_text(world), "cache": True},
        {"role": "user", "content": tail},
    ]
    return Prompt(messages=messages, json_schema=schema)


def _two_head_messages(
    world: World, resident: ResidentView, options: dict[str, list[str]]
) -> list[dict[str, Any]]:
    own = "\n\n".join(s for s in [_profile(world, resident), _diary(resident)] if s)
    now = "\n\n".join(
        [
            situation_text(world),
            _state(world, resident),
            _known_places(world, resident),
            _memories(resident),
            _options(world, resident, options),
        ]
    )
    return [
        {"role": "system", "content": shared_head_text(world, with_format=False), "cache": True},
        {"role": "system", "content": own, "cache": True, "scope": "resident"},
        {"role": "user", "content": now},
    ]


def shared_rules_text(world: World) -> str:
    """Rules, output format and the places without their menus: the same for every resident."""
    places = [
        f"- {p.name} ({p.name_ja}, {p.kind}): hours {p.hours}, capacity {p.capacity}. "
        f"{p.description}"
        for p in world.places
    ]
    return "\n\n".join(
        [
            _INTRO.format(minutes=world.minutes_per_tick),
            _RULES,
            _FORMAT.format(chars=REASON_MAX_CHARS),
            _EXAMPLES,
            "Places of the town:\n" + "\n".join(places),
        ]
    )


def shared_head_text(world: World, with_format: bool) -> str:
    """Rules and the places table: identical for every resident of this town in every tick."""
    parts = [_INTRO.format(minutes=world.minutes_per_tick), _RULES]
    if with_format:
        parts.append(_FORMAT.format(chars=REASON_MAX_CHARS))
    parts.append(_EXAMPLES)
    parts.append("Places of the town (prices in yen):\n" + places_table(world))
    return "\n\n".join(parts)


def places_table(world: World) -> str:
    rows = [
        "| place | 日本語 | kind | hours | capacity | menu | about |",
        "|---|---|---|---|---|---|---|",
    ]
    for place in world.places:
        menu = ", ".join(f"{i.item} {i.price}" for i in place.menu) or "-"
        rows.append(
            f"| {place.name} | {place.name_ja} | {place.kind} | {place.hours} | "
            f"{place.capacity} | {menu} | {place.description} |"
        )
    return "\n".join(rows)


def situation_text(world: World) -> str:
    """The clock, what is open and who is where: identical for every resident in this tick."""
    open_names = [p.name for p in world.open_places()]
    closed_names = [p.name for p in world.places if p.name not in open_names]
    lines = [
        f"Now: {world.clock.label()}.",
        "Open now: " + ", ".join(open_names) + ".",
        "Closed now: " + (", ".join(closed_names) or "nothing") + ".",
        "Who is where:",
    ]
    for place in world.places:
        people = [r.name for r in world.occupants(place.id)]
        if people:
            lines.append(f"- {place.name}: {', '.join(people)}")
    return "\n".join(lines)


def resident_text(
    world: World,
    resident: ResidentView,
    options: dict[str, list[str]],
    shop_info: bool = False,
) -> str:
    """Everything about this one resident, then what they can do now.

    With `shop_info`, the shops' menus and prices are spelled out here, per resident, with
    their visit notes (the layouts whose head does not carry the places table)."""
    places = (
        "## Places (for you)\n" + _naive_places(world, resident)
        if shop_info
        else _known_places(world, resident)
    )
    sections = [_profile(world, resident), _diary(resident), _state(world, resident), places]
    sections += [_memories(resident), _options(world, resident, options)]
    return "\n\n".join(s for s in sections if s)


def _diary(resident: ResidentView) -> str:
    if not resident.diary:
        return ""
    return "\n".join([f"## {resident.name}'s diary (older days, oldest first)", *resident.diary])


def _profile(world: World, resident: ResidentView) -> str:
    work = "no workplace"
    if resident.workplace_id is not None:
        workplace = world.place(resident.workplace_id)
        work = f"works at {workplace.name} (wage {resident.wage_per_hour} yen per hour)"
    return "\n".join(
        [
            f"## The resident: {resident.name}",
            f"Age {resident.age}, {resident.occupation}; {work}.",
            f"Personality: {resident.personality}",
            f"Likes: {', '.join(resident.likes)}.",
            f"Lives at: {world.place(resident.home_id).name}.",
        ]
    )


def _state(world: World, resident: ResidentView) -> str:
    here = world.place(resident.place_id)
    others = [r.name for r in world.occupants(here.id) if r.id != resident.id]
    status = "open" if here.is_open(world.clock) else "closed now"
    return "\n".join(
        [
            f"## {resident.name} now",
            f"At: {here.name} ({here.kind}, {status}). With: {', '.join(others) or 'nobody'}.",
            f"Money: {resident.money} yen.",
            f"Hunger: {resident.hunger}/100, {hunger_words(resident.hunger)}.",
            f"Energy: {resident.energy}/100, {energy_words(resident.energy)}.",
        ]
    )


def _visit_label(times: int) -> str:
    return "once" if times == 1 else f"{times} times, returning"


def _known_places(world: World, resident: ResidentView) -> str:
    places = [p for p in world.places if not p.is_home or p.id == resident.home_id]
    been = [p for p in places if resident.visits.get(p.id, 0)]
    never = [p for p in places if not resident.visits.get(p.id, 0)]
    return "\n".join(
        [
            f"## Places {resident.name} knows",
            "Been to: "
            + "; ".join(f"{p.name} ({_visit_label(resident.visits[p.id])})" for p in been)
            + ".",
            "Not been to yet: " + (", ".join(p.name for p in never) or "none") + ".",
        ]
    )


def _memories(resident: ResidentView) -> str:
    lines = [f"## {resident.name}'s recent memories (newest first)"]
    lines += [f"- {m}" for m in resident.memories] or ["- (none yet)"]
    return "\n".join(lines)


def _option_label(world: World, resident: ResidentView, action: str, target: str) -> str:
    """An option with what it does: "melon pan (180 yen, hunger -20)"."""
    hours = world.minutes_per_tick / 60
    if action == "buy":
        item = world.place(resident.place_id).menu_item(target)
        if item is None:
            return target
        effects = [f"{item.price} yen"]
        effects += [f"hunger {item.hunger:+d}"] if item.hunger else []
        effects += [f"energy {item.energy:+d}"] if item.energy else []
        return f"{target} ({', '.join(effects)})"
    if action == "eat":
        return f"{target} (home-cooked meal, {HOME_MEAL.price} yen, hunger {HOME_MEAL.hunger:+d})"
    if action == "rest":
        return f"{target} (energy +{round(REST_ENERGY_PER_HOUR * hours)})"
    if action == "work":
        return f"{target} (earn {round(resident.wage_per_hour * hours)} yen)"
    if action == "go":
        place = world.place_named(target)
        if place is None:
            return target
        if place.id == resident.home_id:
            return f"{target} (your home: rest, meals)"
        food = cheapest_food(place, is_home=False)
        return (
            f"{target} ({place.kind}, food from {food} yen)" if food else f"{target} ({place.kind})"
        )
    return target


def _options(world: World, resident: ResidentView, options: dict[str, list[str]]) -> str:
    """What the resident can do now, each option with its effect. The prompt ends here, on the
    resident's situation, not on an instruction a small model would copy as its reason."""
    lines = [f"## Options for {resident.name} this turn"]
    for action, targets in options.items():
        labels = [_option_label(world, resident, action, t) for t in targets]
        lines.append(f"- {action}: {'; '.join(labels)}")
    return "\n".join(lines)


def _naive_messages(
    world: World, resident: ResidentView, options: dict[str, list[str]]
) -> list[dict[str, Any]]:
    """The talk's starting point: the resident first, shared facts interleaved with their state."""
    system = "\n\n".join(
        [
            f"You are {resident.name}, {resident.age}, living in Pokomachi (ぽこまち). "
            f"It is {world.clock.label()}. You have {resident.money} yen, hunger "
            f"{resident.hunger}/100 and energy {resident.energy}/100.",
            _INTRO.format(minutes=world.minutes_per_tick),
            _RULES.replace("Rules of the town:", f"Rules for {resident.name}:"),
            _EXAMPLES,
        ]
    )
    user = "\n\n".join(
        s
        for s in [
            _profile(world, resident),
            _diary(resident),
            _state(world, resident),
            _memories(resident),
            "## Places (for you)\n" + _naive_places(world, resident),
            situation_text(world),
            _options(world, resident, options),
            _FORMAT.format(chars=REASON_MAX_CHARS),
        ]
        if s
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _naive_place_line(world: World, resident: ResidentView, place: PlaceView) -> str:
    menu = ", ".join(f"{i.item} {i.price}" for i in place.menu) or "nothing for sale"
    status = "open now" if place.is_open(world.clock) else "closed now"
    times = resident.visits.get(place.id, 0)
    visits = f"you have been here {_visit_label(times)}" if times else "a first visit for you"
    return (
        f"- {place.name} ({place.name_ja}, {place.kind}): {visits}; {status}, hours "
        f"{place.hours}, capacity {place.capacity}; sells {menu}. {place.description}"
    )


def _naive_places(world: World, resident: ResidentView) -> str:
    return "\n".join(
        _naive_place_line(world, resident, p)
        for p in world.places
        if not p.is_home or p.id == resident.home_id
    )
