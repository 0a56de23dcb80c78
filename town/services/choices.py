"""Reading a decision's answer: its JSON checked against its schema, and what the resident chose.

Apart from the decision services (town/services/decisions.py) because the API's serializers
read the choice too, and those services broadcast through them (town/events.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from town.models import Decision

D = Decision.Status


def decision_parse(*, decision: Decision) -> tuple[dict[str, Any] | None, str]:
    """The decision's JSON if it is valid within its schema, else (None, what is wrong)."""
    if decision.status not in (D.COMPUTED, D.APPLIED):
        return None, decision.error or f"no answer ({decision.status})"
    if decision.finish_reason == "length":
        return None, f"output cut off at max_tokens ({decision.run.max_tokens}): raise max_tokens"
    try:
        value = json.loads(decision.raw_output)
    except json.JSONDecodeError as exc:
        return None, f"output is not JSON: {exc}"
    try:
        jsonschema.validate(value, decision.json_schema)
    except jsonschema.ValidationError as exc:
        return None, f"output is outside the decision schema: {exc.message}"
    return value, ""


@dataclass(frozen=True, slots=True)
class DecisionChoice:
    """What the resident chose: "" throughout before an answer, or for one that does not parse."""

    action: str = ""
    target: str = ""
    reason: str = ""


def decision_choice(*, decision: Decision) -> DecisionChoice:
    """The decision's action, target and reason as soon as it is computed: read from its raw
    output until the tick applies it (and stores them), from its fields after."""
    if decision.status != D.COMPUTED:
        return DecisionChoice(decision.action, decision.target, decision.reason)
    value, _ = decision_parse(decision=decision)
    if value is None:
        return DecisionChoice()
    return DecisionChoice(value["action"], value["target"], value.get("reason", ""))
