"""The Django app, installed so its template (cloudflare_access/notice.html) and its settings
check are found."""

from __future__ import annotations

from django.apps import AppConfig
from django.core import checks


class CloudflareAccessConfig(AppConfig):
    name = "pokosite.cloudflare_access"
    label = "cloudflare_access"
    verbose_name = "Cloudflare Access"

    def ready(self) -> None:
        from pokosite.cloudflare_access import schema  # noqa: F401  (registers the extension)
        from pokosite.cloudflare_access.config import access_settings_check

        checks.register(access_settings_check, checks.Tags.security)
