"""Decode alone: `concurrency` requests decoding together with no prompt chunk in their steps.

A workload run's "decode per token" counts the steps each request decoded in, and most of
those also carried another request's prompt chunk (four in flight over eight requests: a new
one starts as each ends). That is what a request of the town sees; it is not the decode step.
Here the workload's first `concurrency` prompts, already in the prefix cache from the run,
are asked again for `num_tokens` tokens each (no schema, EOS ignored): their prefill is one
cached block's worth, then every step decodes all of them and nothing else. Then the first
prompt alone, the same way: decode at one in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

from inference.engine import LLMEngine, SamplingParams
from inference.engine.bench.workload import Workload


@dataclass(frozen=True, slots=True)
class SteadyDecode:
    concurrency: int
    s_per_token: float  # each request's, at `concurrency` in flight: the step's time
    single_s_per_token: float  # one request alone


def measure_steady_decode(
    engine: LLMEngine, workload: Workload, concurrency: int, num_tokens: int = 33
) -> SteadyDecode:
    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    prompts = workload.requests[:concurrency]
    together = engine.generate(prompts, params)
    alone = engine.generate(prompts[:1], params)
    return SteadyDecode(concurrency, _per_token(together), _per_token(alone))


def _per_token(outputs) -> float:
    decode = sum(o.metrics.decode_s for o in outputs)
    steps = sum(max(0, o.metrics.num_output_tokens - 1) for o in outputs)
    return decode / steps
