"""The town in Django admin: lists with filters and search, decisions with their prompt shown
readably (shared head and per-resident tail apart, with token counts), each run's charts and
control buttons (a run is read-only once started), and a compare action that puts the talk's
summary table for several runs side by side. Floats are rounded for people (town/admin_format.py).
"""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, FloatField, QuerySet, Sum
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.decorators import method_decorator
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.text import Truncator
from django.utils.timezone import localtime
from django.views.decorators.http import require_POST

from inference.fleet.health import node_states
from town import services
from town.admin_format import percent_html, rounded_field
from town.errors import RunStateError, TownError
from town.models import (
    DECISION_METRIC_FIELDS,
    Decision,
    Memory,
    Place,
    Resident,
    ResidentState,
    Run,
    Tick,
    Town,
)
from town.quality import TownQuality
from town.reports import (
    run_chart_data,
    runs_baseline_first,
    runs_compare,
    runs_length_warning,
    runs_quality_rows,
)
from town.rules.prompts import num_shared_messages
from town.selectors import run_summary


@admin.register(Town)
class TownAdmin(admin.ModelAdmin):
    list_display = ["name", "seed", "created_at"]
    search_fields = ["name"]


@admin.register(Place)
class PlaceAdmin(admin.ModelAdmin):
    list_display = ["name", "name_ja", "kind", "town", "capacity", "opens_at", "closes_at"]
    list_filter = ["town", "kind"]
    search_fields = ["name", "name_ja", "description"]


@admin.register(Resident)
class ResidentAdmin(admin.ModelAdmin):
    list_display = ["name", "age", "occupation", "town", "home", "workplace", "money"]
    list_filter = ["town", "home"]
    search_fields = ["name", "occupation", "personality"]


@admin.register(ResidentState)
class ResidentStateAdmin(admin.ModelAdmin):
    list_display = ["run", "resident", "place", "money", "hunger", "energy"]
    list_filter = ["run", "place"]
    search_fields = ["resident__name"]


@admin.register(Memory)
class MemoryAdmin(admin.ModelAdmin):
    list_display = ["resident", "run", "tick_index", "text"]
    list_filter = ["run", "resident"]
    search_fields = ["text", "resident__name"]


def _truncated(text: str, num_chars: int) -> str:
    """`text` cut to `num_chars` for a list column, the whole of it on hover."""
    return format_html('<span title="{}">{}</span>', text, Truncator(text).chars(num_chars))


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    # Narrow enough for a 1280 px screen beside the nav sidebar and the filters.
    list_display = [
        "id",
        "layout",
        "model_short",
        "status",
        "ticks",
        "decisions_computed",
        "hit_rate",
        "created",
    ]
    list_filter = ["status", "layout", "model", "town"]
    search_fields = ["id", "layout", "model"]
    readonly_fields = [
        "status",
        "num_ticks_done",
        "num_steps_pending",
        "lease_owner",
        "lease_expires_at",
        "created_at",
        "started_at",
        "finished_at",
    ]
    actions = ["compare_runs", "start_runs", "pause_runs", "stop_runs"]
    change_form_template = "admin/town/run/change_form.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Run]:
        # Summed in the database: the list stays one query however many decisions runs have.
        return (
            super()
            .get_queryset(request)
            .annotate(
                num_cached=Sum("decisions__num_cached_tokens"),
                num_prompt=Sum("decisions__num_prompt_tokens"),
                num_decisions=Count("decisions__num_prompt_tokens"),
            )
        )

    @admin.display(description="hit rate")
    def hit_rate(self, run: Run) -> str:
        return percent_html(run.num_cached, run.num_prompt)

    @admin.display(description="decisions", ordering="num_decisions")
    def decisions_computed(self, run: Run) -> int:
        return run.num_decisions

    @admin.display(description="model", ordering="model")
    def model_short(self, run: Run) -> str:
        return _truncated(run.model, 24)

    @admin.display(description="ticks", ordering="num_ticks_done")
    def ticks(self, run: Run) -> int:
        return run.num_ticks_done

    @admin.display(description="created", ordering="created_at")
    def created(self, run: Run) -> str:
        return format_html(
            '<span title="{}">{}</span>',
            date_format(localtime(run.created_at), "DATETIME_FORMAT"),
            date_format(localtime(run.created_at), "M j, H:i"),
        )

    def has_change_permission(self, request: HttpRequest, obj: Run | None = None) -> bool:
        # A run's settings are what its numbers were measured under: once it has started they
        # are shown, not edited; its buttons (run_control_view) still control it.
        if obj is not None and obj.status != Run.Status.CREATED:
            return False
        return super().has_change_permission(request, obj)

    def get_urls(self):
        compare = self.admin_site.admin_view(self.compare_view)
        control = self.admin_site.admin_view(self.run_control_view)
        return [
            path("compare/", compare, name="town_run_compare"),
            path("<path:object_id>/control/<str:control>/", control, name="town_run_control"),
            *super().get_urls(),
        ]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        run = self.get_object(request, object_id)
        if run is not None:
            extra_context = {
                **(extra_context or {}),
                "controls": services.run_controls_available(run=run),
                "can_control": super().has_change_permission(request),
                "summary_rows": run_summary(run=run).rows(),
                "chart_data": run_chart_data(run=run),
                "quality": TownQuality.from_json(run.quality),
                "node_states": node_states(run.nodes),
            }
        return super().change_view(request, object_id, form_url, extra_context)

    @method_decorator(require_POST)
    def run_control_view(self, request: HttpRequest, object_id: str, control: str):
        """One of the run page's buttons: the service of the same name (services.RUN_CONTROLS),
        then back to the page with what it did or why it refused."""
        if not super().has_change_permission(request):
            raise PermissionDenied
        run = self.get_object(request, object_id)
        if run is None:
            self.message_user(request, f"no run with id {object_id!r}", messages.ERROR)
            return HttpResponseRedirect(reverse("admin:town_run_changelist"))
        service = services.RUN_CONTROLS.get(control)
        if service is None:
            known = ", ".join(services.RUN_CONTROLS)
            self.message_user(request, f"unknown control {control!r}; use {known}", messages.ERROR)
        else:
            try:
                run = service(run=run)
                self.message_user(request, f"run {run.pk}: {control} → {run.status}")
            except TownError as exc:
                self.message_user(request, str(exc), messages.WARNING)
        return HttpResponseRedirect(reverse("admin:town_run_change", args=[run.pk]))

    @admin.action(description="Compare the selected runs (the talk's summary table)")
    def compare_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> HttpResponse | None:
        ids = sorted(queryset.values_list("id", flat=True))
        if len(ids) < 2:
            self.message_user(request, "Pick two or more runs to compare.", messages.ERROR)
            return None
        url = reverse("admin:town_run_compare")
        return HttpResponseRedirect(f"{url}?ids={','.join(map(str, ids))}")

    def compare_view(self, request: HttpRequest) -> HttpResponse:
        raw = request.GET.get("ids", "")
        try:
            ids = [int(part) for part in raw.split(",") if part.strip()]
        except ValueError:
            ids = []
        runs_by_id = Run.objects.in_bulk(ids)
        runs = [runs_by_id[i] for i in ids if i in runs_by_id]
        if len(runs) < 2:
            self.message_user(
                request,
                f"ids={raw!r}: give two or more existing run ids, comma-separated "
                "(or pick runs in the list and use the compare action).",
                messages.ERROR,
            )
            return HttpResponseRedirect(reverse("admin:town_run_changelist"))
        try:
            ordered = runs_baseline_first(runs=runs, baseline=request.GET.get("baseline"))
        except TownError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            ordered = runs
        summaries, rows = runs_compare(runs=ordered)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Compare runs {', '.join(str(r.pk) for r in runs)}",
            "ids": ",".join(str(r.pk) for r in runs),
            "choices": runs,
            "baseline": ordered[0],
            "length_warning": runs_length_warning(runs=runs),
            "runs": list(zip(ordered, summaries, strict=True)),
            "rows": rows,
            "quality_rows": runs_quality_rows(runs=ordered),
        }
        return TemplateResponse(request, "admin/town/run/compare.html", context)

    def _control(self, request: HttpRequest, queryset: QuerySet[Run], service, verb: str) -> None:
        done, refused = [], []
        for run in queryset:
            try:
                service(run=run)
                done.append(str(run.pk))
            except RunStateError as exc:
                refused.append(str(exc))
        if done:
            self.message_user(request, f"{verb}: run {', '.join(done)}", messages.SUCCESS)
        for message in refused:
            self.message_user(request, message, messages.WARNING)

    @admin.action(description="Start the selected runs")
    def start_runs(self, request, queryset):
        self._control(request, queryset, services.run_start, "started")

    @admin.action(description="Pause the selected runs")
    def pause_runs(self, request, queryset):
        self._control(request, queryset, services.run_pause, "paused")

    @admin.action(description="Stop the selected runs")
    def stop_runs(self, request, queryset):
        self._control(request, queryset, services.run_stop, "stopped")


@admin.register(Tick)
class TickAdmin(admin.ModelAdmin):
    list_display = ["__str__", "run", "index", "day", "minute_of_day", "phase", "status"]
    list_filter = ["run", "status", "phase"]
    readonly_fields = ["started_at", "finished_at"]


_cached = DECISION_METRIC_FIELDS.index("num_cached_tokens") + 1
DECISION_METRICS = [
    *DECISION_METRIC_FIELDS[:_cached],
    "cached_by_tier",  # where the cached tokens came from: device pool, host memory, disk
    *DECISION_METRIC_FIELDS[_cached:],
    "attempts",
    "retries",
    "num_sends",
    "started_send",
    "worker",
    "metrics",
]
DECISION_TIMELINE = ["dispatched_at", "started_at", "computed_at", "applied_at"]
DECISION_FLOAT_FIELDS = [f.name for f in Decision._meta.fields if isinstance(f, FloatField)]


def _rounded_name(name: str) -> str:
    """A float field's rounded display on DecisionAdmin (rounded_field), else the field."""
    return f"{name}_rounded" if name in DECISION_FLOAT_FIELDS else name


def _breakpoint_label(message: dict) -> str:
    if not message.get("cache"):
        return ""
    if message.get("scope") == "resident":
        return " · cache breakpoint (this resident's own)"
    return " · cache breakpoint"


def _message_blocks(messages_: list[dict]):
    return format_html_join(
        "",
        '<div class="pk-message"><span class="pk-role">{}{}</span><pre>{}</pre></div>',
        ((m.get("role", "?"), _breakpoint_label(m), m.get("content")) for m in messages_),
    )


@admin.register(Decision)
class DecisionAdmin(admin.ModelAdmin):
    # Narrow enough for a 1280 px screen beside the nav sidebar and the filters; the prompt
    # tokens show on hovering the cache hit, the rest on the decision's page.
    list_display = [
        "id",
        "run_tick",
        "resident",
        "status",
        "choice",
        "valid",
        "cache_hit",
        "e2e_s",
    ]
    list_filter = ["run", "resident", "node", "valid", "action", "status", "finish_reason"]
    search_fields = ["resident__name", "reason", "raw_output", "error", "target"]
    list_select_related = ["tick", "resident", "run"]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "run",
                    "tick",
                    "resident",
                    "node",
                    "status",
                    ("action", "target", "valid"),
                    "reason",
                    "error",
                ]
            },
        ),
        ("Prompt", {"fields": ["prompt", "prompt_hash", "head_hash", "schema"]}),
        ("Output", {"fields": ["raw_output", "finish_reason", "output_token_ids"]}),
        (
            "Engine metrics (vLLM definitions)",
            {"fields": ["weights", *(_rounded_name(name) for name in DECISION_METRICS)]},
        ),
        ("Timeline", {"fields": DECISION_TIMELINE}),
    ]

    # The float fields, rounded (the metrics JSON keeps every digit).
    queue_s_rounded = rounded_field("queue_s")
    prefill_s_rounded = rounded_field("prefill_s")
    decode_s_rounded = rounded_field("decode_s")
    ttft_s_rounded = rounded_field("ttft_s")
    engine_e2e_s_rounded = rounded_field("engine_e2e_s")
    app_e2e_s_rounded = rounded_field("app_e2e_s")
    app_latency_s_rounded = rounded_field("app_latency_s")
    e2e_s = rounded_field("app_e2e_s", "e2e s")  # the list's short header

    def get_queryset(self, request: HttpRequest) -> QuerySet[Decision]:
        # Its title names the resident and the tick's index (Decision.__str__).
        return super().get_queryset(request).select_related("run", "tick", "resident")

    def get_readonly_fields(self, request, obj=None):
        # A decision is a record of what happened: nothing on it is edited by hand.
        rounded = [_rounded_name(name) for name in DECISION_FLOAT_FIELDS]
        return [f.name for f in Decision._meta.fields] + [
            "prompt",
            "schema",
            "cached_by_tier",
            "weights",
            *rounded,
        ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        # Nothing to save: its page is "View decision", with no save buttons. Seeing it needs
        # the view permission (or the change one, as Django's has_view_permission allows).
        return False

    @admin.display(description="run·tick", ordering="tick__index")
    def run_tick(self, decision: Decision) -> str:
        return f"{decision.run_id} · {decision.tick.index}"

    @admin.display(description="choice", ordering="action")
    def choice(self, decision: Decision) -> str:
        if decision.valid is False:
            return "stayed put (fallback)"
        if not decision.action:
            return "-"
        return _truncated(f"{decision.action} → {decision.target}", 20)

    @admin.display(description="hit")
    def cache_hit(self, decision: Decision) -> str:
        return percent_html(decision.num_cached_tokens, decision.num_prompt_tokens)

    @admin.display(description="cached by tier")
    def cached_by_tier(self, decision: Decision) -> str:
        """The cached tokens split by where the engine found them (its KV tiers)."""
        metrics = decision.metrics or {}
        cached = decision.num_cached_tokens
        if cached is None or "num_cached_tokens_disk" not in metrics:
            return "-"
        host = metrics.get("num_cached_tokens_host") or 0
        disk = metrics.get("num_cached_tokens_disk") or 0
        load = metrics.get("kv_load_s") or 0.0
        return (
            f"device pool {cached - host - disk:,} · host memory {host:,} · disk {disk:,} "
            f"(waited {load:.3f} s for them)"
        )

    @admin.display(description="weights")
    def weights(self, decision: Decision) -> str:
        """The engine's weight format this decision ran with (fp32 | int8 | int4), and its KV
        cache's dtype where the engine said (float32 | bfloat16)."""
        metrics = decision.metrics or {}
        weights = metrics.get("weights") or "-"
        kv = metrics.get("kv_cache_dtype")
        return f"{weights} · KV cache {kv}" if kv else weights

    @admin.display(description="JSON schema")
    def schema(self, decision: Decision) -> str:
        return format_html("<pre>{}</pre>", json.dumps(decision.json_schema, indent=2))

    @admin.display(description="prompt")
    def prompt(self, decision: Decision) -> str:
        from inference.completions.tokens import chat_token_counts

        num_head = num_shared_messages(decision.messages)
        head, tail = decision.messages[:num_head], decision.messages[num_head:]
        try:
            head_tokens, total_tokens = chat_token_counts(
                model=decision.run.model, messages=decision.messages, num_head_messages=num_head
            )
            counts = (f"{head_tokens:,} tokens", f"{total_tokens - head_tokens:,} tokens")
            engine_count = decision.num_prompt_tokens or "-"
            total = f"{total_tokens:,} tokens in all (the engine counted {engine_count})"
        except ValueError as exc:
            counts, total = ("? tokens", "? tokens"), f"token counts unavailable: {exc}"
        style = mark_safe(
            "<style>.pk-prompt{max-width:980px}.pk-part{border:2px solid;border-radius:6px;"
            "padding:6px 10px;margin:6px 0}.pk-head{border-color:#2e7d32;background:#f1f8f1}"
            ".pk-tail{border-color:#1565c0;background:#f0f5fc}.pk-part h4{margin:2px 0 6px}"
            ".pk-role{font-weight:bold;font-size:11px;text-transform:uppercase}"
            ".pk-message pre{white-space:pre-wrap;margin:2px 0 8px;font-size:12px}</style>"
        )
        head_html = (
            format_html(
                '<div class="pk-part pk-head"><h4>shared head · {} messages · {}</h4>{}</div>',
                len(head),
                counts[0],
                _message_blocks(head),
            )
            if head
            else mark_safe(
                '<div class="pk-part pk-head"><h4>no shared head (no cache breakpoint): '
                "every token belongs to this resident</h4></div>"
            )
        )
        tail_html = format_html(
            '<div class="pk-part pk-tail"><h4>per-resident tail · {} messages · {}</h4>{}</div>',
            len(tail),
            counts[1],
            _message_blocks(tail),
        )
        return format_html(
            '{}<div class="pk-prompt"><p>{}</p>{}{}</div>', style, total, head_html, tail_html
        )
