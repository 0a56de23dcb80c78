"""Serializer fields that refuse what the database or the engine cannot hold, as a 400 naming
the field instead of a 500 further down: non-finite floats (NaN, ±Infinity: DRF's FloatField
takes "nan" and "inf" from a form), integers past the database's column range (2^31 − 1 for
PostgreSQL's integer, 2^63 − 1 for SQLite and big ids), and ids too large to look up."""

from __future__ import annotations

import math

from rest_framework import serializers

DB_INT_MAX = 2**31 - 1  # PostgreSQL integer (IntegerField, PositiveIntegerField)
DB_INT_MIN = -(2**31)
ID_MAX = 2**63 - 1  # BigAutoField
ID_REGEX = r"\d{1,18}"  # URL lookups: any longer number cannot be an id


class FiniteFloatField(serializers.FloatField):
    default_error_messages = {"not_finite": "must be a finite number, got {value}."}

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if not math.isfinite(value):
            self.fail("not_finite", value=data)
        return value


class DatabaseIntegerField(serializers.IntegerField):
    """An IntegerField bounded to what the column holds unless tighter bounds are given."""

    def __init__(self, **kwargs):
        kwargs.setdefault("min_value", DB_INT_MIN)
        kwargs.setdefault("max_value", DB_INT_MAX)
        super().__init__(**kwargs)


class IdField(serializers.PrimaryKeyRelatedField):
    """A related object's id: a number past any id is a 400, not an OverflowError."""

    default_error_messages = {
        "id_range": f"must be an id between 1 and {ID_MAX}, got {{value}}.",
    }

    def to_internal_value(self, data):
        if isinstance(data, bool):
            self.fail("incorrect_type", data_type=type(data).__name__)
        try:
            number = int(data)
        except (TypeError, ValueError):
            self.fail("incorrect_type", data_type=type(data).__name__)
        if not 1 <= number <= ID_MAX:
            self.fail("id_range", value=str(data)[:40])
        return super().to_internal_value(number)
