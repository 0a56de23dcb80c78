"""SchemaLimits: the issue's costly schemas are refused before any compile, naming the limit."""

from __future__ import annotations

import json
import time

import pytest

from inference.engine import SamplingParams
from inference.engine.structured_output.schema_limits import SchemaLimits, check_schema


def _nested_arrays(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def _refused(schema: dict, limits: SchemaLimits | None = None) -> str:
    with pytest.raises(ValueError) as refused:
        check_schema(json.dumps(schema), limits or SchemaLimits())
    return str(refused.value)


@pytest.mark.parametrize(
    ("schema", "names"),
    [
        # 700 nested arrays (compiles in ~24 s on the 2-core machine): too deep, and too big.
        (_nested_arrays(700), ["max_depth=32 (it nests 701 levels deep)", "max_schema_bytes"]),
        # The issue's pattern: three quantifiers deep, and 1000 repeats through them.
        ({"type": "string", "pattern": "((a+)+){1000}$"}, ["max_quantifier_nesting=2"]),
        ({"type": "string", "pattern": "^([a-z]{1,100}){1,10}$"}, ["max_nested_repeat=100"]),
        ({"type": "string", "pattern": "^a{2000}$"}, ["max_pattern_repeat=1000"]),
        ({"type": "string", "pattern": "a" * 1001}, ["max_pattern_length=1000"]),
        # 26 KB of schema (a long description) is over the size limit whatever its shape.
        ({"type": "string", "description": "x" * 26_000}, ["max_schema_bytes=16384"]),
    ],
)
def test_costly_schemas_are_refused_naming_the_limit(schema, names):
    message = _refused(schema)
    for name in names:
        assert name in message
    assert "simplify the schema" in message


def test_enum_limits_per_enum_and_in_all():
    # With the defaults a 20,000-value enum is already over max_schema_bytes; with room for it
    # the enum limits refuse it on their own.
    roomy = SchemaLimits(max_schema_bytes=1 << 20)
    assert "max_schema_bytes" in _refused({"enum": list(range(20_000))})
    assert "max_enum_values=1000 (an enum has 20000 values)" in _refused(
        {"enum": list(range(20_000))}, roomy
    )
    five_enums = {"anyOf": [{"enum": list(range(900))} for _ in range(5)]}
    assert "max_total_enum_values=4000 (the enums have 4500 values in all)" in _refused(
        five_enums, roomy
    )


def test_patterns_within_the_limits_pass():
    for pattern in (
        r"^[A-Za-z0-9 ,.!?'-]{1,80}$",  # the town's reason
        r"^([a-z0-9]+\.)*[a-z]+$",  # nested, unbounded: nesting 2
        r"^(\d{3}-){2}\d{4}$",
        r"^\{[a-z]{3}\}$",  # escaped braces are not quantifiers
        r"^[{}(]{1,5}$",  # neither are braces in a class
    ):
        check_schema(json.dumps({"type": "string", "pattern": pattern}), SchemaLimits())
    check_schema(json.dumps({"patternProperties": {"^[a-z]{1,20}$": {}}}), SchemaLimits())
    assert "max_nested_repeat" in _refused({"patternProperties": {"^([a-z]{1,50}){1,50}$": {}}})


def test_the_engine_refuses_them_fast_and_compiles_nothing(make_tiny_engine):
    engine = make_tiny_engine()
    for schema in (
        _nested_arrays(700),
        {"type": "string", "pattern": "((a+)+){1000}$"},
        {"type": "string", "enum": [f"value-{i}" for i in range(20_000)]},
    ):
        started = time.perf_counter()
        with pytest.raises(ValueError, match="json_schema is over the limit"):
            engine.generate("hi", SamplingParams(max_tokens=4, json_schema=schema))
        assert time.perf_counter() - started < 2.0  # each compiled in 2-33 s before
    assert engine.structured.cache.num_compiles == 0


def test_engine_config_takes_limits_as_a_dict():
    from inference.engine import EngineConfig

    config = EngineConfig(model="smollm2-tiny-random", schema_limits={"max_depth": 8})
    assert config.schema_limits == SchemaLimits(max_depth=8)
    with pytest.raises(ValueError, match="max_depth must be ≥ 1"):
        SchemaLimits(max_depth=0)
