"""Top-level URLs. Apps mount their own urls.py here as they gain views."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from inference.metrics import metrics_view
from pokosite.views import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="api-schema"), name="api-redoc"),
    path("api/", include("town.api.urls")),
    path("v1/", include("inference.openai_api.urls")),
    path("metrics", metrics_view, name="metrics"),
    path("", include("town.urls")),
]
