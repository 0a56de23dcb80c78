"""System checks (`manage.py check`) for the inference settings."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, register

from inference.nodes import node_names_problems


@register()
def inference_settings_check(app_configs: object, **kwargs: object) -> list[Error]:
    problems = node_names_problems(settings.INFERENCE_NODES)
    errors = [Error(problem, id="inference.E001") for problem in problems]
    if not isinstance(settings.INFERENCE_ENGINE, dict):
        errors.append(
            Error(
                "INFERENCE_ENGINE must be a dict of EngineConfig keyword arguments",
                hint='e.g. {"model": "smollm2-135m-instruct", "device": "cpu"}',
                id="inference.E002",
            )
        )
    return errors
