"""System checks (`manage.py check`) for the inference settings."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, register

from inference.fleet.nodes import node_names_problems


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
    errors += [Error(problem, id="inference.E003") for problem in routing_settings_problems()]
    return errors


def routing_settings_problems() -> list[str]:
    """What is wrong with the routing and heartbeat settings; empty when they are usable."""
    from inference.fleet.router import POLICIES, BalanceThresholds

    problems = []
    if settings.INFERENCE_ROUTING_POLICY not in POLICIES:
        problems.append(
            f"POKOMACHI_ROUTING={settings.INFERENCE_ROUTING_POLICY!r}: use one of "
            + ", ".join(POLICIES)
        )
    try:
        BalanceThresholds(
            abs=settings.INFERENCE_ROUTING_BALANCE_ABS, rel=settings.INFERENCE_ROUTING_BALANCE_REL
        )
    except ValueError as exc:
        problems.append(f"{exc} (POKOMACHI_ROUTING_BALANCE_ABS / POKOMACHI_ROUTING_BALANCE_REL)")
    if settings.INFERENCE_HEARTBEAT_STORE not in ("redis", "memory"):
        problems.append(
            f"POKOMACHI_HEARTBEAT_STORE={settings.INFERENCE_HEARTBEAT_STORE!r}: use redis or memory"
        )
    if not 0 < settings.INFERENCE_HEARTBEAT_INTERVAL_S < settings.INFERENCE_NODE_DOWN_S:
        problems.append(
            "POKOMACHI_HEARTBEAT_INTERVAL must be more than 0 and less than POKOMACHI_NODE_DOWN_S "
            f"(got {settings.INFERENCE_HEARTBEAT_INTERVAL_S:g} and "
            f"{settings.INFERENCE_NODE_DOWN_S:g} s): a live node would count as down"
        )
    return problems
