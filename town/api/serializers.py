"""Serializers: models out as JSON, and the request bodies the write endpoints take."""

from __future__ import annotations

import dataclasses
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from town.api.fields import DatabaseIntegerField, FiniteFloatField, IdField
from town.models import (
    DECISION_METRIC_FIELDS,
    DEFAULT_TEMPERATURE,
    Decision,
    Place,
    Resident,
    ResidentState,
    Run,
    Tick,
    Town,
)
from town.rules.clock import hours_label
from town.rules.prompts import LAYOUTS
from town.selectors import run_summaries, run_summary
from town.services.choices import decision_choice

# Bounds on a run's settings: far above any sensible run, far below what breaks something.
MAX_CONCURRENCY = 256  # decisions in flight
MAX_TICKS = 1_000_000
MAX_RETENTION_INTERVAL = 1 << 20  # tokens; beyond any model's context
MINUTES_PER_DAY = 24 * 60
MAX_DECISION_TIMEOUT_S = 24 * 3600.0


class TownSerializer(serializers.HyperlinkedModelSerializer):
    num_places = serializers.IntegerField(source="places.count", read_only=True)
    num_residents = serializers.IntegerField(source="residents.count", read_only=True)

    class Meta:
        model = Town
        fields = ["id", "url", "name", "seed", "created_at", "num_places", "num_residents"]
        extra_kwargs = {"url": {"view_name": "api:town-detail"}}


class PlaceSerializer(serializers.ModelSerializer):
    hours = serializers.SerializerMethodField(help_text='Opening hours, e.g. "08:00–20:00".')

    class Meta:
        model = Place
        fields = [
            "id",
            "town",
            "name",
            "name_ja",
            "kind",
            "description",
            "x",
            "y",
            "opens_at",
            "closes_at",
            "hours",
            "capacity",
            "menu",
        ]

    def get_hours(self, place: Place) -> str:
        return hours_label(opens_at=place.opens_at, closes_at=place.closes_at)


class ResidentStateSerializer(serializers.ModelSerializer):
    place_name = serializers.CharField(source="place.name", read_only=True)

    class Meta:
        model = ResidentState
        fields = ["run", "place", "place_name", "money", "hunger", "energy", "visits"]


class ResidentSerializer(serializers.ModelSerializer):
    state = serializers.SerializerMethodField(
        help_text="The state in the run given by ?run=, else in the latest run of the town; "
        "null before any run."
    )

    class Meta:
        model = Resident
        fields = [
            "id",
            "town",
            "name",
            "age",
            "occupation",
            "personality",
            "likes",
            "home",
            "workplace",
            "wage_per_hour",
            "money",
            "hunger",
            "energy",
            "state",
        ]

    @extend_schema_field(ResidentStateSerializer(allow_null=True))
    def get_state(self, resident: Resident) -> dict[str, Any] | None:
        state = self.context.get("states", {}).get(resident.pk)
        return ResidentStateSerializer(state).data if state is not None else None


class RunSummarySerializer(serializers.Serializer):
    num_decisions = serializers.IntegerField()
    num_valid = serializers.IntegerField()
    num_retried = serializers.IntegerField()
    token_cache_hit_rate = serializers.FloatField(help_text="cached / prompt tokens, 0..1")
    mean_cached_tokens = serializers.FloatField()
    mean_prompt_tokens = serializers.FloatField()
    mean_output_tokens = serializers.FloatField()
    mean_prefill_s = serializers.FloatField()
    mean_queue_s = serializers.FloatField()
    mean_decode_s = serializers.FloatField()
    median_e2e_s = serializers.FloatField(help_text="The app's: dispatched → answered.")
    median_engine_e2e_s = serializers.FloatField()


class RunListSerializer(serializers.ListSerializer):
    """Many runs: every summary from one query (selectors.run_summaries), not one per run."""

    def to_representation(self, data):
        runs = list(data.all() if hasattr(data, "all") else data)
        self.context["summaries"] = run_summaries(run_ids=[run.pk for run in runs])
        return super().to_representation(runs)


class RunSerializer(serializers.HyperlinkedModelSerializer):
    summary = serializers.SerializerMethodField(help_text="The talk's summary table (slide 15).")

    class Meta:
        model = Run
        list_serializer_class = RunListSerializer
        fields = [
            "id",
            "url",
            "town",
            "layout",
            "model",
            "nodes",
            "routing",
            "concurrency",
            "retention_interval",
            "seed",
            "temperature",
            "max_tokens",
            "minutes_per_tick",
            "decision_timeout_s",
            "ticks_target",
            "status",
            "num_ticks_done",
            "num_steps_pending",
            "created_at",
            "started_at",
            "finished_at",
            "summary",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "url": {"view_name": "api:run-detail"},
            "town": {"view_name": "api:town-detail"},
        }

    @extend_schema_field(RunSummarySerializer)
    def get_summary(self, run: Run) -> dict[str, Any]:
        summary = self.context.get("summaries", {}).get(run.pk) or run_summary(run=run)
        return dataclasses.asdict(summary)


class RunCreateSerializer(serializers.Serializer):
    """The body of POST /api/runs/: what run_create takes. Every number is bounded
    (docs/security.md, "Bad input is a 400"): past the database's range or a sane setting it is a
    400 naming the field."""

    town = IdField(queryset=Town.objects.all())
    layout = serializers.ChoiceField(choices=list(LAYOUTS), default=Run.Layout.SHARED_HEAD)
    nodes = serializers.ListField(
        child=serializers.CharField(max_length=100),
        required=False,
        max_length=64,
        help_text="Default: every node.",
    )
    routing = serializers.ChoiceField(
        choices=Run.Routing.values,
        required=False,
        help_text="How decisions are spread over the nodes: cache_aware (longest cached prefix "
        "unless much busier), round_robin or fixed. Default: the deployment's (POKOMACHI_ROUTING).",
    )
    concurrency = DatabaseIntegerField(min_value=1, max_value=MAX_CONCURRENCY, default=4)
    seed = DatabaseIntegerField(default=0)
    ticks_target = DatabaseIntegerField(
        min_value=1, max_value=MAX_TICKS, required=False, allow_null=True
    )
    retention_interval = DatabaseIntegerField(
        min_value=1, max_value=MAX_RETENTION_INTERVAL, required=False, allow_null=True
    )
    temperature = FiniteFloatField(min_value=0.0, max_value=2.0, default=DEFAULT_TEMPERATURE)
    minutes_per_tick = DatabaseIntegerField(min_value=1, max_value=MINUTES_PER_DAY, default=120)
    decision_timeout_s = FiniteFloatField(
        min_value=0.001, max_value=MAX_DECISION_TIMEOUT_S, required=False
    )
    model = serializers.CharField(
        required=False, max_length=200, help_text="Must be the model the nodes serve."
    )
    start = serializers.BooleanField(default=False, help_text="Start the run at once.")


class TickSerializer(serializers.ModelSerializer):
    num_decisions = serializers.IntegerField(source="decisions.count", read_only=True)

    class Meta:
        model = Tick
        fields = [
            "id",
            "run",
            "index",
            "day",
            "minute_of_day",
            "phase",
            "status",
            "started_at",
            "finished_at",
            "num_decisions",
        ]


DECISION_LIST_FIELDS = [
    "id",
    "url",
    "run",
    "tick",
    "tick_index",
    "resident",
    "resident_name",
    "node",
    "status",
    "action",
    "target",
    "reason",
    "valid",
    "error",
    "attempts",
    "retries",
    "num_sends",
    "started_send",
    "worker",
    *DECISION_METRIC_FIELDS,
    "dispatched_at",
    "started_at",
    "computed_at",
    "applied_at",
]


class DecisionSerializer(serializers.HyperlinkedModelSerializer):
    id = serializers.IntegerField(read_only=True)
    run = serializers.PrimaryKeyRelatedField(read_only=True)
    tick = serializers.PrimaryKeyRelatedField(read_only=True)
    resident = serializers.PrimaryKeyRelatedField(read_only=True)
    tick_index = serializers.IntegerField(source="tick.index", read_only=True)
    resident_name = serializers.CharField(source="resident.name", read_only=True)

    class Meta:
        model = Decision
        fields = DECISION_LIST_FIELDS
        read_only_fields = fields
        extra_kwargs = {"url": {"view_name": "api:decision-detail"}}

    def to_representation(self, decision: Decision) -> dict[str, Any]:
        # The choice shows once computed, before the tick applies it (services.decision_choice).
        data = super().to_representation(decision)
        data.update(dataclasses.asdict(decision_choice(decision=decision)))
        return data


class DecisionDetailSerializer(DecisionSerializer):
    """Everything, the prompt and the raw output included."""

    class Meta(DecisionSerializer.Meta):
        fields = [
            *DECISION_LIST_FIELDS,
            "messages",
            "prompt_hash",
            "head_hash",
            "json_schema",
            "resident_state",
            "raw_output",
            "output_token_ids",
            "finish_reason",
            "metrics",
        ]
        read_only_fields = fields


class DecisionRequestSerializer(serializers.Serializer):
    """The body of POST /api/decisions/: whose decision, in which run."""

    run = IdField(queryset=Run.objects.all())
    resident = IdField(queryset=Resident.objects.all())


class DecisionAcceptedSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    url = serializers.URLField()
    status = serializers.CharField()


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()
