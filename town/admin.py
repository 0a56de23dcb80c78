"""Simple admin registrations; issue 7 brings the rich admin (charts, compare)."""

from django.contrib import admin

from town.models import Decision, Memory, Place, Resident, ResidentState, Run, Tick, Town


@admin.register(Town)
class TownAdmin(admin.ModelAdmin):
    list_display = ["name", "seed", "created_at"]


@admin.register(Place)
class PlaceAdmin(admin.ModelAdmin):
    list_display = ["name", "name_ja", "kind", "town", "capacity", "opens_at", "closes_at"]
    list_filter = ["town", "kind"]


@admin.register(Resident)
class ResidentAdmin(admin.ModelAdmin):
    list_display = ["name", "age", "occupation", "town", "home", "money"]
    list_filter = ["town"]
    search_fields = ["name"]


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "town", "layout", "model", "status", "num_ticks_done", "created_at"]
    list_filter = ["status", "layout"]


@admin.register(ResidentState)
class ResidentStateAdmin(admin.ModelAdmin):
    list_display = ["run", "resident", "place", "money", "hunger", "energy"]
    list_filter = ["run"]


@admin.register(Tick)
class TickAdmin(admin.ModelAdmin):
    list_display = ["run", "index", "day", "minute_of_day", "phase", "status"]
    list_filter = ["run", "status"]


@admin.register(Decision)
class DecisionAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "run",
        "tick",
        "resident",
        "node",
        "status",
        "action",
        "target",
        "valid",
        "retries",
        "num_prompt_tokens",
        "num_cached_tokens",
        "app_e2e_s",
    ]
    list_filter = ["run", "status", "valid", "action", "node"]
    search_fields = ["resident__name", "reason"]


@admin.register(Memory)
class MemoryAdmin(admin.ModelAdmin):
    list_display = ["resident", "run", "tick_index", "text"]
    list_filter = ["run"]
