"""Pokomachi's inference engine: paged KV, prefix caching, continuous batching.

Pure Python + torch (+ xgrammar, gguf, tokenizers); never imports Django-side code.
"""

from inference.engine.config import EngineConfig
from inference.engine.core.llm_engine import LLMEngine
from inference.engine.metrics import EngineStats, RequestMetrics
from inference.engine.outputs import RequestAbortedError, RequestOutput, StreamDelta
from inference.engine.request_errors import EngineShutDown, RequestError
from inference.engine.sampling_params import SamplingParams

__all__ = [
    "EngineConfig",
    "EngineShutDown",
    "EngineStats",
    "LLMEngine",
    "RequestAbortedError",
    "RequestError",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
    "StreamDelta",
]
