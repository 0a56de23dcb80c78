"""Viewsets: parse the request, fetch by id, call one town service or selector, format the answer.

Errors are answered by town/api/errors.py: unknown ids 404, bad bodies and query parameters
400 with field messages, a run in the wrong state 409.
"""

from __future__ import annotations

from django.db.models import QuerySet
from django_filters.rest_framework import DjangoFilterBackend
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
from town.api.errors import TownApiErrorsMixin
from town.api.fields import ID_REGEX
from town.api.filters import (
    STATE_RUN_HELP,
    DecisionFilter,
    PlaceFilter,
    ResidentFilter,
    RunFilter,
    TickFilter,
)
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


class _Base(TownApiErrorsMixin, viewsets.GenericViewSet):
    """Reading as watching a run; changing a run or asking for a decision as the run pages'
    controls (town/api/permissions.py)."""

    pagination_class = Pagination
    filter_backends = [DjangoFilterBackend]  # each list's parameters: town/api/filters.py
    parser_classes = [BoundedJSONParser, FormParser, MultiPartParser]
    permission_classes = [RunPolicy]
    lookup_value_regex = ID_REGEX  # a longer number is no id: 404, not an overflow


class TownViewSet(_Base, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    queryset = Town.objects.order_by("id")
    serializer_class = TownSerializer


class PlaceViewSet(_Base, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    queryset = Place.objects.order_by("id")
    serializer_class = PlaceSerializer
    filterset_class = PlaceFilter


@extend_schema_view(
    retrieve=extend_schema(
        parameters=[OpenApiParameter("run", OpenApiTypes.INT, description=STATE_RUN_HELP)]
    )
)
class ResidentViewSet(_Base, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    queryset = Resident.objects.order_by("id")
    serializer_class = ResidentSerializer
    filterset_class = ResidentFilter

    def get_serializer(self, *args, **kwargs):
        instance = args[0] if args else None
        if instance is not None:
            items = instance if isinstance(instance, list | QuerySet) else [instance]
            kwargs.setdefault("context", self.get_serializer_context())
            kwargs["context"]["states"] = resident_states(
                resident_ids=[r.pk for r in items], run_id=self._state_run_id()
            )
        return super().get_serializer(*args, **kwargs)

    def _state_run_id(self) -> int | None:
        """?run=, checked already by filter_queryset (a bad one was a 400 before this)."""
        params = ResidentFilter(self.request.query_params, queryset=self.queryset)
        params.is_valid()
        return params.form.cleaned_data.get("run")


_error_responses = {400: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer}


def _run_control_schema(summary: str):
    return extend_schema(
        request=None, responses={200: RunSerializer, **_error_responses}, summary=summary
    )


class RunViewSet(_Base, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    queryset = Run.objects.order_by("-id")
    serializer_class = RunSerializer
    filterset_class = RunFilter

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


class TickViewSet(_Base, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    queryset = Tick.objects.order_by("run_id", "index")
    serializer_class = TickSerializer
    filterset_class = TickFilter


class DecisionViewSet(_Base, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    queryset = Decision.objects.select_related("run", "tick", "resident").order_by("id")
    filterset_class = DecisionFilter

    def get_serializer_class(self):
        return DecisionDetailSerializer if self.action == "retrieve" else DecisionSerializer

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
