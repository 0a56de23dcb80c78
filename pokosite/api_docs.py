"""The API's documentation, served from this site alone: the OpenAPI schema (/api/schema/, which
a browser shows as text), Swagger UI (/api/docs/) and Redoc (/api/redoc/).

Swagger UI comes from drf-spectacular-sidecar under /static/ (SPECTACULAR_SETTINGS, with no
validator badge from validator.swagger.io); Redoc from static/vendor/redoc/, a copy of the
sidecar's less the logo its menu footer fetches from cdn.redoc.ly. The two pages' templates
(templates/api/) replace drf-spectacular's heads — its Redoc page asks Google for fonts — with
one that links our favicon and sets a Content-Security-Policy refusing fonts, images, scripts
and stylesheets from other hosts.
"""

from __future__ import annotations

from drf_spectacular.renderers import OpenApiYamlRenderer
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView


class YamlAsTextRenderer(OpenApiYamlRenderer):
    """The schema's YAML as text/plain: a browser shows it where it would download
    application/vnd.oai.openapi."""

    media_type = "text/plain"


class SchemaView(SpectacularAPIView):
    """YAML (application/vnd.oai.openapi) or JSON for API clients, as drf-spectacular serves
    them; the same YAML as text to a browser (it asks for text/html and names no ?format=)."""

    renderer_classes = [*SpectacularAPIView.renderer_classes, YamlAsTextRenderer]

    def perform_content_negotiation(self, request, force=False):
        asks_for_a_page = "text/html" in request.headers.get("Accept", "")
        if asks_for_a_page and "format" not in request.query_params:
            return YamlAsTextRenderer(), YamlAsTextRenderer.media_type
        return super().perform_content_negotiation(request, force=force)


swagger_view = SpectacularSwaggerView.as_view(
    url_name="api-schema", template_name="api/swagger_ui.html"
)
redoc_view = SpectacularRedocView.as_view(url_name="api-schema", template_name="api/redoc.html")
schema_view = SchemaView.as_view()
