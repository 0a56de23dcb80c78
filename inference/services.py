"""The one interface the town asks for completions, its door into inference's two jobs: route
completions to the fleet's nodes (inference/fleet/services.py), and generate one on this
process's engine or on an external OpenAI-compatible server when one is configured
(inference/completions/services.py). Past the door the town never reaches the fleet's router or
prompt prefixes, the engine or its runtime (pyproject.toml's import-linter contracts,
tests/test_import_contracts.py).

Callers pass a CompletionRequest (chat messages, an optional JSON schema, sampling parameters,
an affinity key) and get back a Completion: text, token ids and CompletionMetrics, the same
types whichever backend answered (inference/completions/types.py); `on_text` receives the text
as it is decoded (streaming). Where a request goes is decided here too (`completion_route`, in
the tick loop's process; the node's worker then runs `completion_generate`).
"""

from __future__ import annotations

from inference.completions.runtime import EngineProfile
from inference.completions.services import (
    completion_engine_configured,
    completion_generate,
    completion_head_unpin,
    completion_head_warm,
    completion_model,
    completion_num_text_tokens,
    completion_prompt_token_ids,
    completion_retention_interval,
    completion_schemas_warm,
    completion_schemas_warm_start,
)
from inference.completions.types import Completion, CompletionMetrics, CompletionRequest
from inference.fleet.router import RouteChoice
from inference.fleet.services import completion_node_replacement, completion_route

__all__ = [
    "Completion",
    "CompletionMetrics",
    "CompletionRequest",
    "EngineProfile",
    "RouteChoice",
    "completion_engine_configured",
    "completion_generate",
    "completion_head_unpin",
    "completion_head_warm",
    "completion_model",
    "completion_node_replacement",
    "completion_num_text_tokens",
    "completion_prompt_token_ids",
    "completion_retention_interval",
    "completion_route",
    "completion_schemas_warm",
    "completion_schemas_warm_start",
]
