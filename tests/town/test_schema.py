"""The decision schema's reason: the resident's own short first-person thought."""

from __future__ import annotations

import re

import pytest

from town.rules.schema import REASON_MAX_CHARS, REASON_PATTERN, REASON_SCHEMA_MAX_CHARS

# Longer than the prompt asks for (REASON_MAX_CHARS): the grammar lets the model finish it.
RAN_PAST = "I want to see the old shrine at Kamakura again before the autumn leaves fall."


@pytest.mark.parametrize(
    "reason",
    [
        "I skipped breakfast and anpan sounds perfect.",
        "I'm so tired!",
        "I miss my well-worn sofa.",
        RAN_PAST,
        "I " + "a" * (REASON_SCHEMA_MAX_CHARS - 3) + ".",  # the longest
    ],
)
def test_a_short_first_person_sentence_is_a_reason(reason):
    assert re.fullmatch(REASON_PATTERN, reason)


@pytest.mark.parametrize(
    "reason",
    [
        "Decide what Hina does next.",  # not first person: the prompt's instruction echoed
        "I will go home, I will go home.",  # a comma: room to run on
        "I want melon bread. Then I go home.",  # a full stop inside
        "I forgot to buy the manga volume 550 yen.",  # a price copied from the menu
        "I " + "a" * (REASON_SCHEMA_MAX_CHARS - 2) + ".",  # too long
        "I like it",  # no full stop
        "I am new to-.",  # a word left hanging
        "I like it .",  # a space before the stop
        "I'.",
    ],
)
def test_a_copy_or_a_run_on_is_not_a_reason(reason):
    assert not re.fullmatch(REASON_PATTERN, reason)


def test_the_grammar_lets_a_sentence_run_past_the_length_the_prompt_asks_for():
    """The model ends it, at a word; the grammar never forces the stop mid-word."""
    assert len(RAN_PAST) > REASON_MAX_CHARS and re.fullmatch(REASON_PATTERN, RAN_PAST)
