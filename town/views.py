"""The town view's pages: the run list, a run's live page, its replay, and the staff controls.
Interfaces only: fetch by id, call one selector or service, render or return JSON.

The live page's data comes over the run's WebSocket (town/consumers.py); the JSON views here
serve what a page fetches on demand (a resident's panel, a replay's frames).
"""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from town import services
from town.access import can_control_runs, can_watch_runs
from town.errors import TownError
from town.live import resident_detail, run_header, run_replay
from town.models import Run
from town.selectors import run_summaries

# The same services as `manage.py run_control`: one map, in town/services/runs.py.
CONTROLS = services.RUN_CONTROLS


def watchers_only(view):
    @wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs):
        if not can_watch_runs(request.user):
            return redirect_to_login(request.get_full_path(), reverse("admin:login"))
        return view(request, *args, **kwargs)

    return wrapped


def _page_context(request: HttpRequest, run: Run) -> dict:
    # Every button is on the page; those the run's status does not allow are hidden, and the
    # live page shows and hides them as the status changes, by the same rule as the admin's.
    available = services.run_controls_available(run=run)
    return {
        "run": run,
        "can_control": can_control_runs(request.user),
        "controls": [(name, name in available) for name in CONTROLS],
        "control_statuses": services.run_control_statuses(),
    }


@require_GET
@watchers_only
def run_list(request: HttpRequest) -> HttpResponse:
    runs = list(Run.objects.select_related("town").order_by("-id")[:200])
    summaries = run_summaries(run_ids=[run.pk for run in runs])
    rows = [(run, summaries[run.pk]) for run in runs]
    return render(request, "town/run_list.html", {"rows": rows})


@require_GET
@watchers_only
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("town"), pk=run_id)
    return render(request, "town/run_detail.html", _page_context(request, run))


@require_GET
@watchers_only
def run_resident(request: HttpRequest, run_id: int, resident_id: int) -> JsonResponse:
    run = get_object_or_404(Run, pk=run_id)
    detail = resident_detail(run=run, resident_id=resident_id)
    if detail is None:
        raise Http404(f"resident {resident_id} is not in run {run_id}")
    return JsonResponse(detail)


@require_GET
@watchers_only
def run_replay_page(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("town"), pk=run_id)
    return render(request, "town/run_replay.html", _page_context(request, run))


@require_GET
@watchers_only
def run_replay_data(request: HttpRequest, run_id: int) -> JsonResponse:
    run = get_object_or_404(Run.objects.select_related("town"), pk=run_id)
    return JsonResponse(run_replay(run=run))


@require_POST
def run_control(request: HttpRequest, run_id: int, control: str) -> JsonResponse:
    if not can_control_runs(request.user):
        return JsonResponse({"error": "only staff can control runs; log in at /admin/"}, status=403)
    service = CONTROLS.get(control)
    if service is None:
        return JsonResponse(
            {"error": f"unknown control {control!r}; use one of {', '.join(CONTROLS)}"}, status=400
        )
    run = get_object_or_404(Run, pk=run_id)
    try:
        run = service(run=run)
    except TownError as exc:
        return JsonResponse({"error": str(exc)}, status=409)
    return JsonResponse({"run": run_header(run)})
