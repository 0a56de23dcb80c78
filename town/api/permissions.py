"""The API's one policy, the pages' rule (town/access.py): reading needs what watching a run
needs; everything else — creating and controlling runs, asking for decisions — needs what the
run pages' buttons need (staff, or a service token listed in CONTROL_SERVICE_TOKENS)."""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from town.access import can_control_runs, can_watch_runs


class RunPolicy(BasePermission):
    message = (
        "creating or controlling runs and asking for decisions is for staff (the run pages' "
        "rule); a service token needs its client id in POKOMACHI_CONTROL_SERVICE_TOKENS"
    )

    def has_permission(self, request, view) -> bool:
        if request.method in SAFE_METHODS:
            return can_watch_runs(request.user)
        return can_control_runs(request.user)
