"""How well a run's residents decided: the definitions behind `manage.py town_quality`.

Pure functions over plain records (no Django, no engine), so each definition is tested on
crafted examples (tests/town/test_quality.py). `town/services/quality.py` builds the records
from a run's stored decisions and keeps the result on the run.

Definitions:
- **echo**: a reason copies the prompt when all of it (after its leading "I", at least
  ECHO_WHOLE_WORDS words: "I can do now." from "What Aoi can do now") appears in one prompt
  message, word for word; or when any span of ECHO_SPAN_WORDS consecutive words of it
  appears in one prompt message, word for word, with at least ECHO_SPAN_OWN content words in it
  ("buy a vending machine green tea at Sakura Park" names things, it copies nothing); or when it
  has at least ECHO_MIN_CONTENT_WORDS content words and at least ECHO_LINE_SHARE of them occur
  in one line of the prompt. Content words are those not in STOPWORDS, not an action's name (go,
  buy, eat, ...) and not part of a name of the town (its places, people and menu items): "I am
  going to eat at Midori House" names its choice, it does not copy the line that offers it.
  Words are lower-cased runs of letters and digits.
- **pressing need** and **critical** (starving or exhausted): town/rules/needs.py, the town's
  own thresholds; critical is counted per resident-tick (one decision's prompt state).
- **addressed**: a pressing need was *offered* something for it, and the decision took it.
  Hunger: buying food (an item that lowers hunger by at least needs.FOOD_MIN_HUNGER) or eating
  at home, or going to an open place that sells food the resident can afford, or going home
  when they can afford a meal there. Tiredness: resting, or going home.
- **valid**: the answer parsed, fitted its schema and the town allowed it; a decision that was
  retried (a worker began it more than once) is counted apart; a fallback is what code did
  instead of the model (no usable answer: the resident stayed put).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from town.rules.actions import ACTIONS
from town.rules.needs import EXHAUSTED, STARVING, pressing_need
from town.rules.world import HOME_MEAL

ECHO_SPAN_WORDS = 6
ECHO_SPAN_OWN = 2  # a copied span counts when at least this many of its words are not names
ECHO_WHOLE_WORDS = 3  # a reason (after its "I") this long, all of it found in the prompt
ECHO_MIN_CONTENT_WORDS = 3
ECHO_LINE_SHARE = 0.6
NUM_SAMPLES = 20

_STOPWORDS_TEXT = """
a an the and or but of to in on at for with from by is are was were be been am i you he she it
they we my your his her its their our me him them us this that these those do does did so as if
then than there here now what who which when how all any some no not can will would just very
too up out
"""
STOPWORDS = frozenset(_STOPWORDS_TEXT.split())

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass(frozen=True, slots=True)
class FoodOffer:
    """What in the town feeds a resident: food item names, and for each place that sells food,
    the cheapest food's price (a home with a meal: its price too)."""

    items: frozenset[str]
    places: dict[str, int]


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One decision as the quality measures see it."""

    resident: str
    tick_index: int
    clock: str
    home: str
    place: str
    money: int
    hunger: int
    energy: int
    options: dict[str, list[str]]  # action → targets offered (the schema's cases)
    prompt: list[str]  # the messages' contents, in order
    action: str = ""
    target: str = ""
    reason: str = ""
    valid: bool = False
    retried: bool = False
    error: str = ""
    names: frozenset[str] = frozenset()  # the town's place, resident and menu item names


def echo_of(reason: str, prompt: list[str], names: frozenset[str] = frozenset()) -> str:
    """The prompt text a reason copies ('' when it copies none): a message it shares a
    ECHO_SPAN_WORDS-word span with, or the line that holds most of its content words."""
    said = words(reason)
    if not said:
        return ""
    named = {w for name in names for w in words(name)} | set(ACTIONS)
    whole = said[1:] if said[0] == "i" else said  # a reason is "I ..." by its schema
    for message in prompt:
        text = " " + " ".join(words(message)) + " "
        if len(whole) >= ECHO_WHOLE_WORDS and f" {' '.join(whole)} " in text:
            return " ".join(whole)
        for start in range(len(said) - ECHO_SPAN_WORDS + 1):
            span = said[start : start + ECHO_SPAN_WORDS]
            if f" {' '.join(span)} " in text and _num_own_words(span, named) >= ECHO_SPAN_OWN:
                return " ".join(span)
    content = {w for w in said if w not in STOPWORDS and w not in named}
    if len(content) < ECHO_MIN_CONTENT_WORDS:
        return ""
    for message in prompt:
        for line in message.splitlines():
            shared = content & set(words(line))
            if len(shared) >= ECHO_LINE_SHARE * len(content):
                return line.strip()
    return ""


def _num_own_words(span: list[str], named: set[str]) -> int:
    return sum(w not in STOPWORDS and w not in named for w in span)


def need_choices(record: DecisionRecord, need: str, food: FoodOffer) -> set[tuple[str, str]]:
    """The offered (action, target) pairs that answer `need`."""
    offered = {(a, t) for a, targets in record.options.items() for t in targets}
    if need == "hunger":

        def feeds(action: str, target: str) -> bool:
            if action in ("buy", "eat"):
                return target in food.items or action == "eat"
            if action == "go":
                price = HOME_MEAL.price if target == record.home else food.places.get(target)
                return price is not None and price <= record.money
            return False

        return {(a, t) for a, t in offered if feeds(a, t)}
    if need == "energy":
        return {(a, t) for a, t in offered if a == "rest" or (a == "go" and t == record.home)}
    return set()


@dataclass(frozen=True, slots=True)
class Sample:
    resident: str
    clock: str
    state: str
    options: str
    decision: str
    reason: str
    note: str


@dataclass(slots=True)
class TownQuality:
    """The measures of one run, JSON-ready (`to_json`) for Run.quality."""

    num_decisions: int = 0
    echo_rate: float = 0.0
    echo_examples: list[dict[str, str]] = field(default_factory=list)
    critical_rate: float = 0.0  # resident-ticks at hunger >= STARVING or energy <= EXHAUSTED
    num_need_offered: int = 0
    need_addressed_rate: float | None = None
    need_addressed: dict[str, list[int]] = field(default_factory=dict)  # need → [took, offered]
    # of those, where the menu was not narrowed to the need (town/rules/actions.py): [took, offered]
    need_addressed_unnarrowed: list[int] = field(default_factory=lambda: [0, 0])
    actions: dict[str, int] = field(default_factory=dict)
    num_distinct_actions: int = 0
    num_talks: int = 0
    num_places_visited: int = 0
    invalid_rate: float = 0.0
    num_invalid: int = 0
    num_retried: int = 0
    num_fallbacks: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    hit_rate: float | None = None
    median_e2e_s: float | None = None
    samples: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TownQuality | None:
        """The measures kept on a run (Run.quality), or None when it was never measured."""
        if not data:
            return None
        known = {name for name in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) lines for a person, in the issue's order."""
        took = self.need_addressed
        needs = ", ".join(f"{n} {t}/{o}" for n, (t, o) in sorted(took.items())) or "none offered"
        free_took, free = self.need_addressed_unnarrowed
        needs += f"; from a full menu {free_took}/{free}"
        return [
            ("decisions", str(self.num_decisions)),
            ("echo rate", _pct(self.echo_rate)),
            ("resident-ticks starving or exhausted", _pct(self.critical_rate)),
            (
                "pressing needs addressed when offered",
                f"{_pct(self.need_addressed_rate)} ({needs})",
            ),
            ("distinct actions", f"{self.num_distinct_actions} {dict(self.actions)}"),
            ("talks between residents", str(self.num_talks)),
            ("places visited", str(self.num_places_visited)),
            (
                "invalid",
                f"{_pct(self.invalid_rate)} ({self.num_invalid}; fallbacks "
                f"{self.num_fallbacks}, retried {self.num_retried})",
            ),
            ("token cache hit rate", _pct(self.hit_rate)),
            (
                "median end-to-end",
                "-" if self.median_e2e_s is None else f"{self.median_e2e_s:.2f} s",
            ),
        ]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def town_quality_measure(
    records: list[DecisionRecord],
    *,
    food: FoodOffer,
    hit_rate: float | None = None,
    median_e2e_s: float | None = None,
    seed: int = 0,
) -> TownQuality:
    """The measures of `records`; the engine's figures (hit rate, median end-to-end) are the
    run summary's, passed in, so a prompt that reads better but destroys reuse shows beside."""
    quality = TownQuality(num_decisions=len(records), hit_rate=hit_rate, median_e2e_s=median_e2e_s)
    if not records:
        return quality
    reasons = [(r, echo_of(r.reason, r.prompt, r.names)) for r in records if r.reason]
    echoes = [(r, copied) for r, copied in reasons if copied]
    quality.echo_rate = _share(len(echoes), len(reasons))
    quality.echo_examples = [{"reason": r.reason, "copies": c} for r, c in echoes[:5]]
    critical = [r for r in records if r.hunger >= STARVING or r.energy <= EXHAUSTED]
    quality.critical_rate = _share(len(critical), len(records))

    addressed: dict[str, list[int]] = {}
    for record in records:
        need = pressing_need(record.hunger, record.energy)
        choices = need_choices(record, need, food) if need else set()
        if not choices:
            continue
        took = record.valid and (record.action, record.target) in choices
        counts = addressed.setdefault(need, [0, 0])
        counts[1] += 1
        counts[0] += took
        offered = {(a, t) for a, targets in record.options.items() for t in targets}
        if offered != choices:
            quality.need_addressed_unnarrowed[1] += 1
            quality.need_addressed_unnarrowed[0] += took
    quality.need_addressed = addressed
    quality.num_need_offered = sum(o for _, o in addressed.values())
    if quality.num_need_offered:
        took = sum(t for t, _ in addressed.values())
        quality.need_addressed_rate = took / quality.num_need_offered

    valid = [r for r in records if r.valid]
    quality.actions = dict(Counter(r.action for r in valid).most_common())
    quality.num_distinct_actions = len(quality.actions)
    quality.num_talks = sum(r.action == "talk" for r in valid)
    quality.num_places_visited = len({r.target for r in valid if r.action == "go"})
    quality.num_invalid = len(records) - len(valid)
    quality.invalid_rate = _share(quality.num_invalid, len(records))
    quality.num_fallbacks = quality.num_invalid  # the resident stayed put; code chose that
    quality.num_retried = sum(r.retried for r in records)
    quality.errors = dict(Counter(_error_kind(r.error) for r in records if not r.valid))

    picked = random.Random(seed).sample(records, min(NUM_SAMPLES, len(records)))
    quality.samples = [asdict(_sample(r)) for r in sorted(picked, key=_order)]
    return quality


def _order(record: DecisionRecord) -> tuple[int, str]:
    return record.tick_index, record.resident


def _error_kind(error: str) -> str:
    return error.split(":")[0][:60] or "no answer"


def _sample(record: DecisionRecord) -> Sample:
    options = "; ".join(f"{a}: {', '.join(t)}" for a, t in record.options.items())
    decided = f"{record.action} {record.target}" if record.valid else "(fallback: stayed put)"
    copied = echo_of(record.reason, record.prompt, record.names)
    return Sample(
        resident=record.resident,
        clock=record.clock,
        state=f"at {record.place}, ¥{record.money}, hunger {record.hunger}, energy {record.energy}",
        options=options,
        decision=decided,
        reason=record.reason,
        note=(f"echo: {copied!r}" if copied else "") or record.error,
    )
