"""The town's decision schemas sit far inside the engine's SchemaLimits (the margin is stated
here, so a change to either side that eats it fails)."""

from __future__ import annotations

import json

from inference.engine.structured_output.schema_limits import (
    SchemaLimits,
    _quantifiers,
    _text_depth,
    check_schema,
)
from town.demo import MENUS, PLACES, RESIDENT_POOL
from town.rules.schema import REASON_PATTERN, decision_schema


def _largest_decision_schema() -> dict:
    """Every action at once, each with every target it could ever have in the demo town."""
    places = [place[0] for place in PLACES]
    return decision_schema(
        {
            "go": places[1:],
            "stay": places[:1],
            "buy": [item[0] for menu in MENUS.values() for item in menu],  # more than any menu
            "eat": places[:1],
            "talk": [resident[0] for resident in RESIDENT_POOL],
            "rest": places[:1],
            "work": places[:1],
        }
    )


def test_the_largest_town_schema_has_a_wide_margin_under_every_limit():
    limits = SchemaLimits()
    text = json.dumps(_largest_decision_schema())
    check_schema(text, limits)
    enums = [case["properties"]["target"]["enum"] for case in json.loads(text)["anyOf"]]
    quantifiers = _quantifiers(REASON_PATTERN)
    measured = {
        "max_schema_bytes": len(text.encode()),
        "max_depth": _text_depth(text),
        "max_enum_values": max(len(enum) for enum in enums),
        "max_total_enum_values": sum(len(enum) for enum in enums),
        "max_pattern_length": len(REASON_PATTERN),
        "max_pattern_repeat": max(count for count, _, _ in quantifiers),
        "max_quantifier_nesting": max(nesting for _, nesting, _ in quantifiers),
    }
    assert measured["max_quantifier_nesting"] == 1  # nothing nested: max_nested_repeat unused
    margins = {name: getattr(limits, name) / value for name, value in measured.items()}
    assert min(margins.values()) >= 2
    # All but the quantifier nesting (1 of 2) leave at least 4×: bytes ~6.7× (2.4 KB), depth
    # ~5× (6), one enum ~45× (22), all enums ~80× (50), pattern length ~38×, repeat 12.5× (80).
    assert all(m >= 4 for name, m in margins.items() if name != "max_quantifier_nesting"), margins


def test_the_reason_is_defined_once_whatever_the_number_of_actions():
    """xgrammar compiles an inline pattern once per case and a "$ref" once: four actions'
    schema with the reason inline took 4x the compile (29 s on Gemma 3's vocabulary)."""
    text = json.dumps(_largest_decision_schema())
    assert text.count(json.dumps(REASON_PATTERN)) == 1
    assert len(json.loads(text)["anyOf"]) == 7
