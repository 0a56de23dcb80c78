"""The decision schema's reason: the resident's own short first-person thought."""

from __future__ import annotations

import re

import pytest

from town.rules.schema import REASON_MAX_CHARS, REASON_PATTERN


@pytest.mark.parametrize(
    "reason",
    ["I skipped breakfast and anpan sounds perfect.", "I'm so tired!", "I miss my well-worn sofa."],
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
        "I " + "a" * REASON_MAX_CHARS + ".",  # too long
        "I like it",  # no full stop
    ],
)
def test_a_copy_or_a_run_on_is_not_a_reason(reason):
    assert not re.fullmatch(REASON_PATTERN, reason)
