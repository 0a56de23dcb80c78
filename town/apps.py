"""The town app: residents, places, runs and ticks."""

from django.apps import AppConfig


class TownConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "town"
    label = "town"
