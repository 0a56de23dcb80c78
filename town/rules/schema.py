"""The JSON schema of one decision, built from live state.

One case per action the resident can take now, each with the targets it allows: the model,
decoding under this schema, cannot name a closed or non-existent place, an item it cannot
afford, or a person who is not there. `reason` is short plain text, so the output stays within
a few dozen tokens (`DECISION_MAX_TOKENS` leaves room for the longest).
"""

from __future__ import annotations

from typing import Any

# What the prompt asks for: one short sentence of at most this many characters.
REASON_MAX_CHARS = 60
# The resident's own thought: one short sentence in the first person ("I ...", ending in "." or
# "!"). A small model cannot start it by copying a third-person line of the prompt ("Decide what
# ... does next"), and with no comma or full stop inside it cannot run on ("I will go to the
# next town, I will go to the next town, ..."). ASCII letters, spaces, apostrophes and hyphens:
# one token per character at worst, no escapes. No digits: a thought needs no price, and a
# reason with one was most often a menu line copied with its price ("I forgot to buy the manga
# volume 550 yen.", run 12 in docs/TOWN.md). The last character before the stop is a letter:
# never a dangling hyphen, apostrophe or space.
#
# The grammar's bound is twice the prompt's: with room to spare the model ends the sentence
# itself, after its last word. A bound at the asked length (it was {1,57}) forced the full stop
# wherever it fell, mid-word ("... at Kam.", "... new to-."). Without any bound a model that
# never ends (the tiny random one) runs to max_tokens and the whole answer is lost; and a
# bounded repeat costs compile time in proportion to its bound and the vocabulary (a star would
# cost nothing, but both tiny random models then never end: 0 of 12 answers within 160 tokens).
# Stored whole: Decision.reason holds 300.
REASON_SCHEMA_MAX_CHARS = 2 * REASON_MAX_CHARS
REASON_PATTERN = rf"^I[ '][A-Za-z '-]{{0,{REASON_SCHEMA_MAX_CHARS - 4}}}[A-Za-z][.!]$"
# {"action":"...","target":"...","reason":"..."}: ~20 tokens of keys and punctuation, a target
# name of up to ~20 tokens, the longest reason at ~3 characters a token (a sentence in words;
# the grammar would let a model spell it a character a token): within a run's max_tokens (160).
DECISION_MAX_TOKENS = 20 + 20 + REASON_SCHEMA_MAX_CHARS // 3 + 20

REASON_SCHEMA: dict[str, Any] = {"type": "string", "pattern": REASON_PATTERN}
# Every action's case refers to the one reason definition: xgrammar compiles a "$ref" once, an
# inline copy once per case. A four-action schema compiles 4x faster (xgrammar, one thread:
# SmolLM2's vocabulary 10.1 s -> 2.5 s, Gemma 3's 29.1 s -> 7.3 s, past the engine's 20 s
# compile deadline before).
_REASON_REF = {"$ref": "#/$defs/reason"}


def decision_schema(options: dict[str, list[str]]) -> dict[str, Any]:
    """`options` (action → allowed targets, from `actions.action_options`) as a JSON schema."""
    if not options:
        raise ValueError("a decision needs at least one possible action; options is empty")
    cases = [
        {
            "type": "object",
            "properties": {
                "action": {"type": "string", "const": action},
                "target": {"type": "string", "enum": list(targets)},
                "reason": _REASON_REF,
            },
            "required": ["action", "target", "reason"],
            "additionalProperties": False,
        }
        for action, targets in options.items()
    ]
    definitions = {"$defs": {"reason": REASON_SCHEMA}}
    if len(cases) == 1:
        return {"title": "Decision", **cases[0], **definitions}
    return {"title": "Decision", "anyOf": cases, **definitions}
