"""The memory plan: what a model needs per rank (weights by kind, the KV/state per token of each
attention kind, the activation reserve) and whether it fits, from its config alone.

`python -m inference.engine.memory_plan --model M` asks before any weight is downloaded; the
engine logs the same plan at start and refuses to start when it does not fit (`check_engine`).
"""

from inference.engine.memory_plan.engine_check import check_engine
from inference.engine.memory_plan.model_spec import FLASH_NAME, ModelSpec, model_spec
from inference.engine.memory_plan.plan import MemoryPlan, plan_memory
from inference.engine.memory_plan.weights import Sharding, WeightBytes, weight_bytes

__all__ = [
    "FLASH_NAME",
    "MemoryPlan",
    "ModelSpec",
    "Sharding",
    "WeightBytes",
    "check_engine",
    "model_spec",
    "plan_memory",
    "weight_bytes",
]
