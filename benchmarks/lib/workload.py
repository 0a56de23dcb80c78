"""The town-shaped workload: chat requests sharing one head, and the decision schema.

Every request is [system, user]: the system message (rules + a table of places) is the same
for all requests of a workload — the shared head a town puts first so the prefix cache can
reuse it — and the user message (one resident's state and memories) is that request's own.
Everything is drawn from `random.Random(seed)`, so a seed always gives the same workload;
sizes are measured in tokens with the engine's own tokenizer.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any, Protocol

from inference.engine.attention.block_runs import first_difference

ACTIONS = ["go_to", "stay", "work", "eat", "buy", "talk_to", "rest"]
# The 135M model, left alone, gives one-word reasons; a minimum keeps outputs near the ~50
# tokens a town decision averages (the original's was ~51). Letters and basic punctuation
# only: no escapes, at most one token per character, and no digits (this model spells numbers
# one token per digit, and given the memories' timestamps it would quote them).
REASON_MIN_CHARS = 50
REASON_MAX_CHARS = 100
REASON_PATTERN = rf"^[A-Za-z ,.'!?-]{{{REASON_MIN_CHARS},{REASON_MAX_CHARS}}}$"
# A cap no decision can reach: ~25 tokens of keys, action and place name, the reason at worst
# one token per character, the closing quote and brace, EOS.
DECISION_MAX_TOKENS = 25 + REASON_MAX_CHARS + 3

_RULES = [
    "You are the mind of one resident of Pokomachi (ぽこまち), a small seaside town.",
    "Each turn you choose the resident's next action from the allowed actions only.",
    "The target must be one of the places in the table below; never invent a place.",
    "A closed place cannot be visited: check its opening hours against the current time.",
    "Residents with less money than a place's price cannot buy anything there.",
    "Hungry residents (hunger above 70) should eat soon; tired ones (energy below 20) rest.",
    "Keep promises from memories when you can: meeting a friend beats wandering.",
    "Work shifts matter: a resident with a shift starting within the hour goes to work.",
    "Rain closes the beach and the open-air market; the shrine stays open in any weather.",
    "Stay in character: a shy resident rarely talks to strangers, a chatty one often does.",
    "The reason is one sentence of plain English words, 50 to 100 characters, no digits.",
    "Festival days (お祭り) keep the shopping street open two hours longer than usual.",
    "Children must be home by 19:00; the elderly prefer quiet places in the afternoon.",
    "Gossip spreads: what is said at the bathhouse is known by the whole town next day.",
]
_NAME_PARTS = [
    ("Kamome", "かもめ"), ("Sakura", "さくら"), ("Umi", "うみ"), ("Hoshi", "ほし"),
    ("Kaze", "かぜ"), ("Tsuki", "つき"), ("Momiji", "もみじ"), ("Hinata", "ひなた"),
    ("Nagisa", "なぎさ"), ("Komorebi", "こもれび"), ("Shiokaze", "しおかぜ"), ("Yuuhi", "ゆうひ"),
    ("Asahi", "あさひ"), ("Kawa", "かわ"), ("Midori", "みどり"), ("Tanpopo", "たんぽぽ"),
]  # fmt: skip
_KINDS = [
    ("Bakery", "bread, pastries, morning coffee", 300),
    ("Cafe", "coffee, cake, quiet reading", 450),
    ("Ramen", "ramen, gyoza, late dinners", 900),
    ("Bookshop", "books, manga, a reading corner", 700),
    ("Park", "walks, picnics, a pond with carp", 0),
    ("Shrine", "prayers, omikuji fortunes, festivals", 100),
    ("Fish Market", "fresh fish, early auctions", 600),
    ("Bathhouse", "hot baths, gossip, milk in glass bottles", 500),
    ("Clinic", "check-ups, medicine", 1500),
    ("School", "classes, the library, the sports ground", 0),
    ("Izakaya", "drinks, yakitori, karaoke on Fridays", 1800),
    ("Post Office", "letters, parcels, savings", 0),
    ("Beach", "swimming, sandcastles, sunsets", 0),
    ("Workshop", "carpentry, repairs, lessons", 800),
    ("Greengrocer", "vegetables, fruit, pickles", 400),
    ("Station", "trains to the city every 40 minutes", 250),
]
_DISTRICTS = ["Harbor", "Old Town", "Hillside", "Station Front", "Riverside", "Shopping Street"]
_FIRST_NAMES = ["Aoi", "Haruto", "Yui", "Sota", "Mei", "Riku", "Hana", "Kenji", "Emi", "Taro"]
_FAMILY_NAMES = ["Tanaka", "Suzuki", "Sato", "Kobayashi", "Ito", "Watanabe", "Yamamoto"]
_JOBS = ["baker", "fisher", "teacher", "nurse", "student", "shopkeeper", "carpenter", "retired"]
_TRAITS = ["shy", "chatty", "curious", "careful", "cheerful", "grumpy", "generous", "lazy"]
_TOPICS = [
    "the summer festival", "a lost cat", "the new train timetable", "the price of tuna",
    "a broken bicycle", "tomorrow's weather", "a letter from the city", "the school play",
    "a recipe for curry", "the noise from the izakaya", "an old photograph", "fishing rights",
]  # fmt: skip
_FEELINGS = [
    "it was a pleasant talk", "they argued a little", "it made them laugh",
    "they felt worried afterwards", "they promised to meet again", "nobody agreed",
    "「また明日ね」と言って別れた", "少し寂しい気持ちになった", "it was over quickly",
]  # fmt: skip
_WEATHER = ["sunny", "cloudy", "light rain", "windy", "foggy", "clear and cold"]


class ChatTokenizer(Protocol):
    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]: ...


class PlainTextChat:
    """For a base model (no chat template in its GGUF, e.g. gemma3-270m): messages rendered as
    plain text sections, encoded with the tokenizer's own special tokens (BOS)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        text = "".join(f"### {m['role']}\n{m['content']}\n\n" for m in messages)
        if add_generation_prompt:
            text += "### assistant\n"
        return self.tokenizer.encode(text, add_special_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)


def chat_tokenizer_for(tokenizer) -> ChatTokenizer:
    """The tokenizer itself when its model has a chat template, else a plain-text rendering."""
    if getattr(tokenizer, "chat_template_source", True) is None:
        return PlainTextChat(tokenizer)
    return tokenizer


@dataclass(frozen=True, slots=True)
class Workload:
    requests: list[list[dict[str, str]]]  # chat messages, one list per request
    schema: dict[str, Any]
    num_head_tokens: int  # the rendered system message, in tokens
    num_shared_prefix_tokens: int  # longest prefix every rendered prompt shares
    prompt_token_counts: list[int]
    # Of each prompt, the tokens an earlier prompt starts with: the most a prefix cache reuses
    # (the shared head; on tick 2 also the resident's own head from tick 1).
    prompt_reused_tokens: list[int]
    seed: int


def build_workload(
    tokenizer: ChatTokenizer,
    *,
    num_requests: int = 8,
    head_tokens: int = 1200,
    prompt_token_range: tuple[int, int] = (1500, 2500),
    seed: int = 0,
    ticks: int = 1,
) -> Workload:
    """`num_requests` chat requests of `prompt_token_range` tokens sharing a `head_tokens` head.

    ticks=2: the town's real pattern, num_requests / 2 residents asked twice: each user message
    is the resident's own head (who they are, their memories), the same on both ticks, then
    the tick's own tail (time, weather, money, needs); all of tick 1, then all of tick 2."""
    low, high = prompt_token_range
    if num_requests < 1:
        raise ValueError(f"num_requests must be ≥ 1, got {num_requests}")
    if ticks not in (1, 2) or num_requests % ticks:
        raise ValueError(f"ticks must be 1 or 2 and divide num_requests, got {ticks}")
    if not head_tokens + 100 <= low <= high:
        raise ValueError(
            f"prompt_token_range {prompt_token_range} must satisfy head_tokens + 100 "
            f"({head_tokens + 100}) ≤ low ≤ high: each request needs room for its own part"
        )
    rng = random.Random(seed)
    places = _places(rng)
    system, num_rows = _system_message(tokenizer, places, head_tokens, rng)
    places = places[:num_rows]  # the places the head lists: the only valid targets
    num_head = len(tokenizer.apply_chat_template([system], add_generation_prompt=False))
    if ticks == 1:
        requests = [
            _request(tokenizer, system, places, rng.randint(low, high), rng)
            for _ in range(num_requests)
        ]
    else:
        residents = [
            _resident(tokenizer, system, places, rng.randint(low, high), rng)
            for _ in range(num_requests // 2)
        ]
        requests = [
            [system, _user(head, tails[tick])] for tick in range(2) for head, tails in residents
        ]
    token_lists = [tokenizer.apply_chat_template(messages) for messages in requests]
    return Workload(
        requests=requests,
        schema=decision_schema([place["name"] for place in places]),
        num_head_tokens=num_head,
        num_shared_prefix_tokens=first_difference(token_lists, min(map(len, token_lists))),
        prompt_token_counts=[len(tokens) for tokens in token_lists],
        prompt_reused_tokens=reused_prefix_lengths(token_lists),
        seed=seed,
    )


def reused_prefix_lengths(token_lists: list[list[int]]) -> list[int]:
    """For each prompt, the longest prefix it shares with any earlier one."""

    def common(a: list[int], b: list[int]) -> int:
        return first_difference([a, b], min(len(a), len(b)))

    return [
        max((common(tokens, earlier) for earlier in token_lists[:i]), default=0)
        for i, tokens in enumerate(token_lists)
    ]


def decision_schema(place_names: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": list(ACTIONS)},
            "target": {"type": "string", "enum": list(place_names)},
            "reason": {
                "type": "string",
                "minLength": REASON_MIN_CHARS,
                "maxLength": REASON_MAX_CHARS,
                "pattern": REASON_PATTERN,
            },
        },
        "required": ["action", "target", "reason"],
        "additionalProperties": False,
    }


def is_valid_decision(text: str, schema: dict[str, Any]) -> bool:
    """Does `text` parse as JSON and satisfy `decision_schema`'s constraints?"""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    properties = schema["properties"]
    if not isinstance(value, dict) or set(value) != set(schema["required"]):
        return False
    for key, rule in properties.items():
        item = value[key]
        if not isinstance(item, str):
            return False
        if "enum" in rule and item not in rule["enum"]:
            return False
        if not rule.get("minLength", 0) <= len(item) <= rule.get("maxLength", len(item)):
            return False
        if "pattern" in rule and re.search(rule["pattern"], item) is None:
            return False
    return True


def candidate_place_names() -> list[str]:
    """Every name a workload's place table can hold (the schema's targets are some of them)."""
    return [f"{roman} {kind}" for roman, _ in _NAME_PARTS for kind, _, _ in _KINDS]


# ---- building the text -------------------------------------------------------------------


def _places(rng: random.Random) -> list[dict[str, Any]]:
    combos = [(name, kind) for name in _NAME_PARTS for kind in _KINDS]
    rng.shuffle(combos)
    places = []
    for (roman, kana), (kind, offers, price) in combos:
        opens = rng.choice([5, 6, 7, 8, 9, 10, 11, 17])
        places.append(
            {
                "name": f"{roman} {kind}",
                "kana": kana,
                "district": rng.choice(_DISTRICTS),
                "hours": "always open" if price == 0 else f"{opens:02d}:00–{opens + 9:02d}:00",
                "offers": offers,
                "price": price,
            }
        )
    return places


def _system_message(
    tokenizer: ChatTokenizer, places: list[dict[str, Any]], head_tokens: int, rng: random.Random
) -> tuple[dict[str, str], int]:
    rules = list(_RULES)
    rng.shuffle(rules)
    intro = "## Rules\n" + "\n".join(f"{i + 1}. {rule}" for i, rule in enumerate(rules))
    header = "\n\n## Places\n| place | かな | district | hours | what you can do | price (yen) |\n"
    header += "|---|---|---|---|---|---|\n"

    def render(num_rows: int) -> dict[str, str]:
        rows = "".join(
            f"| {p['name']} | {p['kana']} | {p['district']} | {p['hours']} | {p['offers']} | "
            f"{p['price']} |\n"
            for p in places[:num_rows]
        )
        return {"role": "system", "content": intro + header + rows}

    def size(num_rows: int) -> int:
        return len(tokenizer.apply_chat_template([render(num_rows)], add_generation_prompt=False))

    if size(1) > head_tokens:
        raise ValueError(
            f"head_tokens={head_tokens} is too small: the rules and one place already take "
            f"{size(1)} tokens"
        )
    low, high = 1, len(places)  # size() grows with the rows: find the most that fit
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if size(middle) <= head_tokens else (low, middle - 1)
    num_rows = low
    if size(num_rows) < head_tokens * 0.9:
        raise ValueError(
            f"head_tokens={head_tokens} is too large: all {len(places)} places make a head of "
            f"{size(num_rows)} tokens"
        )
    return render(num_rows), num_rows


def _request(
    tokenizer: ChatTokenizer,
    system: dict[str, str],
    places: list[dict[str, Any]],
    target_tokens: int,
    rng: random.Random,
) -> list[dict[str, str]]:
    name = f"{rng.choice(_FIRST_NAMES)} {rng.choice(_FAMILY_NAMES)}"
    hour = rng.randint(6, 21)
    state = (
        f"## Resident\nName: {name}, age {rng.randint(8, 84)}, {rng.choice(_JOBS)}, "
        f"{rng.choice(_TRAITS)} and {rng.choice(_TRAITS)}.\n"
        f"Now: day {rng.randint(1, 30)}, {hour:02d}:{rng.choice(['00', '15', '30', '45'])}, "
        f"{rng.choice(_WEATHER)}. At {rng.choice(places)['name']}.\n"
        f"Money: {rng.randint(0, 20) * 250} yen. Hunger: {rng.randint(0, 100)}. "
        f"Energy: {rng.randint(0, 100)}. Mood: {rng.choice(_TRAITS)}.\n\n## Memories\n"
    )
    question = f"\nDecide what {name.split()[0]} does next."

    def messages(memories: list[str]) -> list[dict[str, str]]:
        return [system, {"role": "user", "content": state + "".join(memories) + question}]

    memories: list[str] = []
    while len(tokenizer.apply_chat_template(messages(memories))) < target_tokens:
        memories.append(_memory(rng, places, hour))
    return messages(memories)


def _resident(
    tokenizer: ChatTokenizer,
    system: dict[str, str],
    places: list[dict[str, Any]],
    target_tokens: int,
    rng: random.Random,
) -> tuple[str, tuple[str, str]]:
    """A resident's own head (identity, memories) sized so that head + tick 1's tail make
    ~target_tokens, and the tails of two ticks."""
    name = f"{rng.choice(_FIRST_NAMES)} {rng.choice(_FAMILY_NAMES)}"
    identity = (
        f"## Resident\nName: {name}, age {rng.randint(8, 84)}, {rng.choice(_JOBS)}, "
        f"{rng.choice(_TRAITS)} and {rng.choice(_TRAITS)}.\n\n## Memories\n"
    )
    hours = sorted(rng.sample(range(8, 22), 2))

    def tail(hour: int) -> str:
        return (
            f"\n## Now\nDay {rng.randint(1, 30)}, {hour:02d}:{rng.choice(['00', '30'])}, "
            f"{rng.choice(_WEATHER)}. At {rng.choice(places)['name']}.\n"
            f"Money: {rng.randint(0, 20) * 250} yen. Hunger: {rng.randint(0, 100)}. "
            f"Energy: {rng.randint(0, 100)}. Mood: {rng.choice(_TRAITS)}.\n"
            f"Decide what {name.split()[0]} does next."
        )

    tails = (tail(hours[0]), tail(hours[1]))
    memories: list[str] = []
    head = identity
    while len(tokenizer.apply_chat_template([system, _user(head, tails[0])])) < target_tokens:
        memories.append(_memory(rng, places, hours[0]))
        head = identity + "".join(memories)
    return head, tails


def _user(head: str, tail: str) -> dict[str, str]:
    return {"role": "user", "content": head + tail}


def _memory(rng: random.Random, places: list[dict[str, Any]], hour: int) -> str:
    when = f"{rng.randint(max(hour - 12, 0), hour - 1):02d}:{rng.randint(0, 59):02d}"
    other = f"{rng.choice(_FIRST_NAMES)} {rng.choice(_FAMILY_NAMES)}"
    place = rng.choice(places)["name"]
    return rng.choice(
        [
            f"- {when} Talked with {other} at {place} about {rng.choice(_TOPICS)}; "
            f"{rng.choice(_FEELINGS)}.\n",
            f"- {when} Spent {rng.randint(1, 12) * 100} yen at {place}; {rng.choice(_FEELINGS)}.\n",
            f"- {when} Saw {other} walking towards {place} in a hurry.\n",
            f"- {when} Promised {other} to meet at {place} tomorrow about {rng.choice(_TOPICS)}.\n",
            f"- {when} {other}さんに{place}で会った。{rng.choice(_TOPICS)}の話をした。\n",
        ]
    )
