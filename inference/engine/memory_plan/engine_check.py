"""The engine's start: its memory plan logged (as vLLM logs weights, KV cache and maximum
concurrency), and a plan that does not fit refused before any weight is loaded."""

from __future__ import annotations

import logging

from inference.engine.config import EngineConfig
from inference.engine.memory_plan.device_memory import device_memory_bytes
from inference.engine.memory_plan.plan import MemoryPlan, plan_memory

logger = logging.getLogger(__name__)


def check_engine(config: EngineConfig) -> MemoryPlan:
    """The plan of `config` with its own KV budget on this rank's memory; ValueError naming the
    shortfall when it does not fit."""
    plan = plan_memory(config, device_memory_bytes(config), kv_budget="configured")
    logger.info("%s", plan.table())
    if not plan.fits:
        raise ValueError(
            f"{plan.shortfall_message()} (device_memory_bytes: the memory one rank may use)"
        )
    return plan
