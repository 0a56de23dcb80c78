"""The list endpoints' query parameters, as django-filter FilterSets: each parameter is parsed,
checked (a bad one is a 400 naming it, as a bad body field is) and documented in the OpenAPI
schema in one place. Blank parameters filter nothing; unknown ones are ignored."""

from __future__ import annotations

import django_filters as filters
from django import forms
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field

from town.api.fields import ID_MAX
from town.models import Decision, Place, Resident, Run, Tick


class IdFormField(forms.Field):
    """A whole number that can be an id: past any id is a 400, not an OverflowError."""

    def to_python(self, value):
        if value in self.empty_values:
            return None
        try:
            number = int(value)
        except ValueError:
            raise forms.ValidationError(
                "must be a whole number (an id), got %(value)r", params={"value": value}
            ) from None
        if not 1 <= number <= ID_MAX:
            raise forms.ValidationError(
                f"must be an id between 1 and {ID_MAX}, got %(value)s",
                params={"value": str(value)[:40]},
            )
        return number


class BooleanFormField(forms.Field):
    """true/1/yes or false/0/no; anything else is a 400 (Django's NullBooleanField reads it as
    no filter at all)."""

    def to_python(self, value):
        if value in self.empty_values:
            return None
        if value.lower() in ("true", "1", "yes"):
            return True
        if value.lower() in ("false", "0", "no"):
            return False
        raise forms.ValidationError("must be true or false, got %(value)r", params={"value": value})


class IdFilter(filters.Filter):
    field_class = IdFormField


def _id_filter(description: str, **kwargs) -> IdFilter:
    # drf-spectacular takes an annotated filter's description from the annotation only.
    schema = {"type": "integer", "description": description}
    return extend_schema_field(schema)(IdFilter(**kwargs))


@extend_schema_field(OpenApiTypes.BOOL)
class StrictBooleanFilter(filters.Filter):
    field_class = BooleanFormField


def _of(what: str) -> IdFilter:
    return _id_filter(f"Only those of this {what}.")


STATE_RUN_HELP = "Show each resident's state in this run (default: the town's latest run)."


class PlaceFilter(filters.FilterSet):
    town = _of("town")

    class Meta:
        model = Place
        fields = ["town"]


class ResidentFilter(filters.FilterSet):
    town = _of("town")
    # Not a filter: which run's state each resident shows (ResidentViewSet reads it).
    run = _id_filter(STATE_RUN_HELP, method="_state_run")

    class Meta:
        model = Resident
        fields = ["town", "run"]

    def _state_run(self, queryset, name, value):
        return queryset


class RunFilter(filters.FilterSet):
    town = _of("town")

    class Meta:
        model = Run
        fields = ["town"]


class TickFilter(filters.FilterSet):
    run = _of("run")

    class Meta:
        model = Tick
        fields = ["run"]


class DecisionFilter(filters.FilterSet):
    run = _of("run")
    resident = _of("resident")
    tick = _of("tick (its id)")
    node = filters.CharFilter(help_text="Only those of this node.")
    status = filters.ChoiceFilter(
        choices=Decision.Status.choices,
        error_messages={
            "invalid_choice": "must be one of "
            + ", ".join(Decision.Status.values)
            + "; got %(value)r"
        },
    )
    valid = StrictBooleanFilter()
    action = filters.CharFilter(help_text="go, stay, buy, talk, ...")

    class Meta:
        model = Decision
        fields = ["run", "resident", "tick", "node", "status", "valid", "action"]
