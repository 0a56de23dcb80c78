"""Top-level URLs. Apps mount their own urls.py here as they gain views."""

from django.contrib import admin
from django.urls import include, path

from inference.admin_views import nodes_view
from inference.completions.metrics import metrics_view
from pokosite import api_docs
from pokosite.views import favicon, healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("favicon.ico", favicon, name="favicon"),
    path("admin/nodes/", admin.site.admin_view(nodes_view), name="admin-nodes"),
    path("admin/", admin.site.urls),
    path("api/schema/", api_docs.schema_view, name="api-schema"),
    path("api/docs/", api_docs.swagger_view, name="api-docs"),
    path("api/redoc/", api_docs.redoc_view, name="api-redoc"),
    path("api/", include("town.api.urls")),
    path("v1/", include("inference.openai_api.urls")),
    path("metrics", metrics_view, name="metrics"),
    path("", include("town.urls")),
]
