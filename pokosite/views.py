"""Project-level views: the health check (the one URL Cloudflare Access leaves open) and the
favicon browsers ask for at /favicon.ico."""

from django.http import HttpRequest, HttpResponseRedirect, JsonResponse
from django.templatetags.static import static
from django.views.decorators.http import require_GET


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@require_GET
def favicon(request: HttpRequest) -> HttpResponseRedirect:
    """To static/favicon.svg (a temporary redirect: its static URL changes with its content)."""
    return HttpResponseRedirect(static("favicon.svg"))
