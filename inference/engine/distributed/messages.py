"""What rank 0 sends the workers (communicator.broadcast_message), in the order they arrive:
the EngineConfig, then a RunnerSetup, then one of RunStep / Heartbeat / Shutdown at
a time. What comes back is only the logits of the sampled rows (gathered in the lm head)."""

from __future__ import annotations

from dataclasses import dataclass

from inference.engine.runner.model_runner import StepBatch


@dataclass(slots=True)
class RunStep:
    batch: StepBatch  # block copies included: every rank copies its own shard's slots


@dataclass(slots=True)
class Heartbeat:
    """Sent by an idle rank 0 so the workers' wait for the next step does not time out."""


@dataclass(slots=True)
class Shutdown:
    pass
