"""Bounds on a JSON schema, checked before any grammar is compiled.

xgrammar's compile time grows steeply with some shapes: deep nesting (700 nested arrays: 24 s
on the 2-core test machine), huge enums (20,000 values: 2 s), and above all nested bounded
repetitions in a pattern (`([a-z]{1,100}){1,10}`: 33 s, where `[a-z]{1,1000}` takes 0.07 s).
Each limit below is checked on the schema's text or its parsed form in linear time, and a
schema over one is refused with a ValueError naming the limit and the value found. The compile
deadline (grammar_compiler) catches whatever slips between them.

The defaults leave the town's own decision schemas a wide margin (tests/town/test_schema_limits
measures the largest: 2.4 KB, depth 6, 22 values in one enum and 50 in all, one pattern of 26
characters repeating at most 80 times, no nested quantifier).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SchemaLimits:
    max_schema_bytes: int = 16_384  # UTF-8 bytes of the schema's JSON text
    max_depth: int = 32  # nested JSON objects/arrays in the schema document
    max_enum_values: int = 1_000  # values in one enum
    max_total_enum_values: int = 4_000  # values in all enums of the schema together
    max_pattern_length: int = 1_000  # characters of one regex (pattern, patternProperties)
    max_pattern_repeat: int = 1_000  # n and m of one {n}, {n,}, {n,m}
    max_quantifier_nesting: int = 2  # quantifiers inside quantified groups: ((a+)+) is 2
    max_nested_repeat: int = 100  # product of the counts along nested quantifiers

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            if getattr(self, name) < 1:
                raise ValueError(f"SchemaLimits.{name} must be ≥ 1, got {getattr(self, name)}")


def check_schema(schema_text: str, limits: SchemaLimits) -> None:
    """ValueError naming every limit the schema is over (with the value found); None when it is
    within all. Size and depth are read off the text; the rest needs it parsed, so it is
    checked only once those two pass."""
    over: list[tuple[str, int, str]] = []
    num_bytes = len(schema_text.encode("utf-8", "surrogatepass"))
    if num_bytes > limits.max_schema_bytes:
        over.append(("max_schema_bytes", limits.max_schema_bytes, f"it is {num_bytes} bytes"))
    if num_bytes <= 64 * limits.max_schema_bytes:  # a huge text is refused on size alone
        depth = _text_depth(schema_text)
        if depth > limits.max_depth:
            over.append(("max_depth", limits.max_depth, f"it nests {depth} levels deep"))
    if not over:
        over = _parsed_problems(schema_text, limits)
    if over:
        listed = "; ".join(f"{name}={limit} ({found})" for name, limit, found in over)
        raise ValueError(
            f"json_schema is over the limit{'s' if len(over) > 1 else ''} {listed}: simplify "
            "the schema (these bounds keep grammar compilation fast for every caller)"
        )


def _parsed_problems(schema_text: str, limits: SchemaLimits) -> list[tuple[str, int, str]]:
    try:
        schema = json.loads(schema_text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"invalid json_schema: not valid JSON ({exc})") from exc
    over: list[tuple[str, int, str]] = []
    total_enum_values = 0
    for node in _walk(schema):
        enum = node.get("enum")
        if isinstance(enum, list):
            if len(enum) > limits.max_enum_values:
                found = f"an enum has {len(enum)} values"
                over.append(("max_enum_values", limits.max_enum_values, found))
            total_enum_values += len(enum)
        for pattern in _patterns(node):
            over.extend(pattern_problems(pattern, limits))
    if total_enum_values > limits.max_total_enum_values:
        found = f"the enums have {total_enum_values} values in all"
        over.append(("max_total_enum_values", limits.max_total_enum_values, found))
    return list(dict.fromkeys(over))  # one line per distinct problem


def pattern_problems(pattern: str, limits: SchemaLimits) -> list[tuple[str, int, str]]:
    """The regex limits one pattern is over: its length, a repetition count, and how deep and
    how multiplied its quantifiers nest; as (limit name, limit, what was found)."""
    over: list[tuple[str, int, str]] = []
    if len(pattern) > limits.max_pattern_length:
        found = f"a pattern is {len(pattern)} characters"
        over.append(("max_pattern_length", limits.max_pattern_length, found))
        return over
    quantifiers = _quantifiers(pattern)
    count = max((c for c, _, _ in quantifiers), default=0)
    nesting = max((d for _, d, _ in quantifiers), default=0)
    product = max((p for _, d, p in quantifiers if d > 1), default=0)
    shown = _short(pattern)
    if count > limits.max_pattern_repeat:
        found = f"pattern {shown} repeats {count} times"
        over.append(("max_pattern_repeat", limits.max_pattern_repeat, found))
    if nesting > limits.max_quantifier_nesting:
        found = f"pattern {shown} nests quantifiers {nesting} deep"
        over.append(("max_quantifier_nesting", limits.max_quantifier_nesting, found))
    if product > limits.max_nested_repeat:
        found = f"pattern {shown} repeats {product} times through nested quantifiers"
        over.append(("max_nested_repeat", limits.max_nested_repeat, found))
    return over


def _short(pattern: str) -> str:
    return repr(pattern if len(pattern) <= 40 else pattern[:37] + "...")


def _text_depth(text: str) -> int:
    """The deepest nesting of [ and { outside strings, without parsing (json.loads would hit
    the recursion limit first on a deep document)."""
    depth = max_depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            max_depth = max(max_depth, depth)
        elif char in "]}":
            depth -= 1
    return max_depth


def _walk(value: Any):
    """Every dict in the parsed schema (iteratively: the depth is already bounded, but a stack
    costs nothing)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _patterns(node: dict[str, Any]) -> list[str]:
    patterns = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
    pattern_properties = node.get("patternProperties")
    if isinstance(pattern_properties, dict):
        patterns.extend(pattern_properties)
    return patterns


def _quantifiers(pattern: str) -> list[tuple[int, int, int]]:
    """(largest count, nesting depth, product of counts down the nest) of each quantifier.

    A quantifier's nesting is 1 on a character or class, 1 + the deepest inside a group; its
    product multiplies its count (at least 1: `*`, `+`, `?` count 1) by the largest product
    inside the group. Escapes and character classes are skipped as single atoms.
    """
    found: list[tuple[int, int, int]] = []
    # Per open group: (deepest nesting inside, largest product inside).
    stack: list[list[int]] = [[0, 1]]
    last: tuple[int, int] | None = None  # the atom before: (nesting inside, product inside)
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        if char == "\\":
            i += 2
            last = (0, 1)
            continue
        if char == "[":
            i = _class_end(pattern, i)
            last = (0, 1)
            continue
        if char == "(":
            stack.append([0, 1])
            i += 1
            last = None
            continue
        if char == ")" and len(stack) > 1:
            inner = stack.pop()
            last = (inner[0], inner[1])
            _merge(stack[-1], inner[0], inner[1])
            i += 1
            continue
        count, end = _quantifier_at(pattern, i)
        if count is not None and last is not None:
            nesting, product = last[0] + 1, max(count, 1) * last[1]
            found.append((count, nesting, product))
            _merge(stack[-1], nesting, product)
            last = None
            i = end
            if i < n and pattern[i] in "?+":  # lazy or possessive
                i += 1
            continue
        last = (0, 1) if char not in "|^$" else None
        i += 1
    return found


def _merge(group: list[int], nesting: int, product: int) -> None:
    group[0] = max(group[0], nesting)
    group[1] = max(group[1], product)


def _class_end(pattern: str, start: int) -> int:
    """The index after the ] that closes the class opened at `start`."""
    i = start + 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1  # a ] first is a literal
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


def _quantifier_at(pattern: str, i: int) -> tuple[int | None, int]:
    """(its largest count, the index after it) when a quantifier starts at i, else (None, i)."""
    char = pattern[i]
    if char in "*+?":
        return 1, i + 1
    if char != "{":
        return None, i
    close = pattern.find("}", i)
    body = pattern[i + 1 : close] if close > 0 else ""
    counts = [c.strip() for c in body.partition(",")[::2]]
    if not any(counts) or not all(c.isdigit() for c in counts if c):
        return None, i  # a literal {
    # A count of more than 18 digits is over any limit: capped, never parsed (int() refuses
    # 4,300 digits and more).
    largest = max(int(c) if len(c) <= 18 else 10**18 for c in counts if c)
    return largest, close + 1
