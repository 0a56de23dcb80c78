"""The inference app: completions (inference/completions/) and the node fleet
(inference/fleet/); ready() registers the system checks and connects a node worker's signals."""

from django.apps import AppConfig


class InferenceConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "inference"
    label = "inference"
    verbose_name = "Inference"

    def ready(self) -> None:
        from inference import checks  # noqa: F401  (registers the system checks)
        from inference.fleet.worker import worker_signals_connect

        worker_signals_connect()
