"""Viewsets: parse the request, fetch by id, call one town service or selector, format the answer.

Errors are answered by town/api/errors.py: unknown ids 404, bad bodies and query parameters
400 with field messages, a run in the wrong state 409.
"""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.pagination import PageNumberPagination
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse

from town import services
from town.api.errors import TownApiErrorsMixin, bool_param, choice_param, int_param
from town.api.fields import ID_REGEX
from town.api.parsers import BoundedJSONParser
from town.api.permissions import RunPolicy
from town.api.serializers import (
    DecisionAcceptedSerializer,
    DecisionDetailSerializer,
    DecisionRequestSerializer,
    DecisionSerializer,
    ErrorSerializer,
    PlaceSerializer,
    ResidentSerializer,
    RunCreateSerializer,
    RunSerializer,
    TickSerializer,
    TownSerializer,
)
from town.models import Decision, Place, Resident, Run, Tick, Town
from town.reports import resident_states
from town.services.decision_requests import decision_request
from town.simulation import lease_owner_name
from town.tasks import decision_send


class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


def _id_param(name: str, what: str) -> OpenApiParameter:
    return OpenApiParameter(name, OpenApiTypes.INT, description=f"Only those of this {what}.")


class _Base(TownApiErrorsMixin, viewsets.GenericViewSet):
    """Reading as watching a run; changing a run or asking for a decision as the run pages'
    controls (town/api/permissions.py)."""

    pagination_class = Pagination
    parser_classes = [BoundedJSONParser, FormParser, MultiPartParser]
    permission_classes = [RunPolicy]
    lookup_value_regex = ID_REGEX  # a longer number is no id: 404, not an overflow


class TownViewSet(_Base, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    queryset = Town.objects.order_by("id")
    serializer_class = TownSerializer


@extend_schema_view(list=extend_schema(parameters=[_id_param("town", "town")]))
class PlaceViewSet(_Base, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    serializer_class = PlaceSerializer

    def get_queryset(self) -> QuerySet[Place]:
        places = Place.objects.order_by("id")
        town_id = int_param(self.request.query_params, "town")
        return places if town_id is None else places.filter(town_id=town_id)


_run_param = OpenApiParameter(
    "run", OpenApiTypes.INT, description="Show each resident's state in this run."
)


@extend_schema_view(
    list=extend_schema(parameters=[_id_param("town", "town"), _run_param]),
    retrieve=extend_schema(parameters=[_run_param]),
)
class ResidentViewSet(_Base, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    serializer_class = ResidentSerializer

    def get_queryset(self) -> QuerySet[Resident]:
        residents = Resident.objects.order_by("id")
        town_id = int_param(self.request.query_params, "town")
        return residents if town_id is None else residents.filter(town_id=town_id)

    def get_serializer(self, *args, **kwargs):
        instance = args[0] if args else None
        if instance is not None:
            items = instance if isinstance(instance, list | QuerySet) else [instance]
            kwargs.setdefault("context", self.get_serializer_context())
            kwargs["context"]["states"] = resident_states(
                resident_ids=[r.pk for r in items],
                run_id=int_param(self.request.query_params, "run"),
            )
        return super().get_serializer(*args, **kwargs)


_error_responses = {400: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer}


def _run_control_schema(summary: str):
    return extend_schema(
        request=None, responses={200: RunSerializer, **_error_responses}, summary=summary
    )


@extend_schema_view(list=extend_schema(parameters=[_id_param("town", "town")]))
class RunViewSet(_Base, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    serializer_class = RunSerializer

    def get_queryset(self) -> QuerySet[Run]:
        runs = Run.objects.order_by("-id")
        town_id = int_param(self.request.query_params, "town")
        return runs if town_id is None else runs.filter(town_id=town_id)

    @extend_schema(
        request=RunCreateSerializer, responses={201: RunSerializer, 400: ErrorSerializer}
    )
    def create(self, request: Request) -> Response:
        body = RunCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        fields = dict(body.validated_data)
        start = fields.pop("start")
        run = services.run_create(**fields)
        if start:
            run = services.run_start(run=run)
        data = self.get_serializer(run).data
        return Response(data, status=status.HTTP_201_CREATED, headers={"Location": data["url"]})

    def _control(self, service) -> Response:
        return Response(self.get_serializer(service(run=self.get_object())).data)

    @_run_control_schema("Start a created run.")
    @action(detail=True, methods=["post"])
    def start(self, request: Request, pk: str) -> Response:
        return self._control(services.run_start)

    @_run_control_schema("Pause a running run after the tick in progress.")
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str) -> Response:
        return self._control(services.run_pause)

    @_run_control_schema("Resume a paused or stopped run.")
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str) -> Response:
        return self._control(services.run_resume)

    @_run_control_schema("One more tick, then paused.")
    @action(detail=True, methods=["post"])
    def step(self, request: Request, pk: str) -> Response:
        return self._control(services.run_step)

    @_run_control_schema("Stop after the tick in progress; it can be resumed later.")
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str) -> Response:
        return self._control(services.run_stop)


@extend_schema_view(list=extend_schema(parameters=[_id_param("run", "run")]))
class TickViewSet(_Base, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    serializer_class = TickSerializer

    def get_queryset(self) -> QuerySet[Tick]:
        ticks = Tick.objects.order_by("run_id", "index")
        run_id = int_param(self.request.query_params, "run")
        return ticks if run_id is None else ticks.filter(run_id=run_id)


@extend_schema_view(
    list=extend_schema(
        parameters=[
            _id_param("run", "run"),
            _id_param("resident", "resident"),
            _id_param("tick", "tick (its id)"),
            OpenApiParameter("node", OpenApiTypes.STR, description="Only those of this node."),
            OpenApiParameter("status", OpenApiTypes.STR, enum=Decision.Status.values),
            OpenApiParameter("valid", OpenApiTypes.BOOL),
            OpenApiParameter("action", OpenApiTypes.STR, description="go, stay, buy, talk, ..."),
        ]
    )
)
class DecisionViewSet(_Base, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    def get_serializer_class(self):
        return DecisionDetailSerializer if self.action == "retrieve" else DecisionSerializer

    def get_queryset(self) -> QuerySet[Decision]:
        params = self.request.query_params
        decisions = Decision.objects.select_related("tick", "resident").order_by("id")
        filters = {
            "run_id": int_param(params, "run"),
            "resident_id": int_param(params, "resident"),
            "tick_id": int_param(params, "tick"),
            "node": params.get("node") or None,
            "status": choice_param(params, "status", Decision.Status.values),
            "valid": bool_param(params, "valid"),
            "action": params.get("action") or None,
        }
        return decisions.filter(**{k: v for k, v in filters.items() if v is not None})

    @extend_schema(
        request=DecisionRequestSerializer,
        responses={202: DecisionAcceptedSerializer, **_error_responses},
        summary="Ask for one resident's decision now (the run's next tick); poll its URL.",
    )
    def create(self, request: Request) -> Response:
        body = DecisionRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        decision = decision_request(
            run=body.validated_data["run"],
            resident=body.validated_data["resident"],
            send=decision_send,
            owner=lease_owner_name("api"),
        )
        url = reverse("api:decision-detail", args=[decision.pk], request=request)
        return Response(
            {"id": decision.pk, "url": url, "status": decision.status},
            status=status.HTTP_202_ACCEPTED,
            headers={"Location": url},
        )
