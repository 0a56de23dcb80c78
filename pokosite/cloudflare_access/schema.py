"""The OpenAPI (drf-spectacular) description of Access authentication: the JWT header.
Imported by the app's ready(), which is what registers the extension."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension

from pokosite.cloudflare_access.tokens import HEADER_NAME


class CloudflareAccessScheme(OpenApiAuthenticationExtension):
    target_class = "pokosite.cloudflare_access.authentication.CloudflareAccessAuthentication"
    name = "cloudflareAccess"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": HEADER_NAME,
            "description": "The Cloudflare Access JWT (Access adds it in front of the site).",
        }
