"""Jump-forward decoding: the tokens a JSON schema forces are appended without a step of their
own, the output still parses and validates, and the engine counts them."""

from __future__ import annotations

import json

import jsonschema
import pytest

from inference.engine import SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"enum": ["go", "stay", "talk"]},
        "target": {"enum": ["Kissa Komorebi", "Hondana Books", "Sakura Park"]},
        "reason": {"type": "string", "maxLength": 30},
    },
    "required": ["action", "target", "reason"],
    "additionalProperties": False,
}

MESSAGES = [
    [
        {"role": "system", "content": "You live in a small town."},
        {"role": "user", "content": f"Resident {i}: where do you go now?"},
    ]
    for i in range(4)
]


def _run(engine, params):
    before = engine.stats()
    outs = engine.generate(MESSAGES, params)
    after = engine.stats()
    return (
        outs,
        after.num_steps - before.num_steps,
        after.num_forced_tokens - before.num_forced_tokens,
    )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_forced_tokens_skip_steps_and_the_output_still_validates(make_tiny_engine, temperature):
    on = make_tiny_engine(enable_jump_forward=True)
    off = make_tiny_engine(enable_jump_forward=False)
    params = SamplingParams(max_tokens=80, temperature=temperature, seed=7, json_schema=SCHEMA)
    outs_on, steps_on, forced_on = _run(on, params)
    outs_off, steps_off, forced_off = _run(off, params)
    for out in [*outs_on, *outs_off]:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)
    assert forced_off == 0 and all(o.metrics.num_forced_tokens == 0 for o in outs_off)
    # Keys, quotes, colons and the rest of an enum value once its first token is chosen.
    assert all(o.metrics.num_forced_tokens >= 8 for o in outs_on)
    assert forced_on == sum(o.metrics.num_forced_tokens for o in outs_on)
    assert all(o.metrics.num_forced_tokens < o.metrics.num_output_tokens for o in outs_on)
    # Four requests decode together: the longest output sets the step count, less what it was
    # forced. Fewer steps for the same kind of answer.
    assert steps_on < steps_off
    longest = max(outs_on, key=lambda o: o.metrics.num_output_tokens)
    assert steps_on <= longest.metrics.num_output_tokens - longest.metrics.num_forced_tokens + 2


def test_jump_forward_respects_max_tokens(make_tiny_engine):
    engine = make_tiny_engine(enable_jump_forward=True)
    params = SamplingParams(max_tokens=3, temperature=0.0, json_schema=SCHEMA)
    for out in engine.generate(MESSAGES[:2], params):
        assert out.finish_reason == "length"
        assert len(out.token_ids) == 3
        assert out.text.startswith('{"')


def test_without_a_schema_nothing_is_forced(make_tiny_engine):
    engine = make_tiny_engine(enable_jump_forward=True)
    out = engine.generate(MESSAGES[0], SamplingParams(max_tokens=8, temperature=0.0))[0]
    assert out.metrics.num_forced_tokens == 0
