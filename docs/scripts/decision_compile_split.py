"""A town decision on the default model (SmolLM2-135M): compile / queue / prefill / decode,
with its schema unseen (cold grammar cache) and again once that schema is compiled (warm)."""

import time

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from town.rules.schema import DECISION_MAX_TOKENS, decision_schema

OPTIONS = {
    "go": ["Bakery Komugi", "Kissaten Hoshi", "Shrine on the Hill", "Park", "Bookshop Shiori"],
    "buy": ["melon pan", "coffee"],
    "talk": ["Ben", "Chie"],
    "stay": ["here"],
}
MESSAGES = [
    {"role": "system", "content": "You live in Pokomachi. Decide what to do next as JSON."},
    {"role": "user", "content": "It is 7:00. You are Aki, at home, hungry. Decide."},
]
engine = LLMEngine(EngineConfig(model="smollm2-135m-instruct"))
try:
    params = SamplingParams(max_tokens=DECISION_MAX_TOKENS, json_schema=decision_schema(OPTIONS))
    for label in ("cold", "warm"):
        started = time.perf_counter()
        (out,) = engine.generate(MESSAGES, params)
        m = out.metrics
        total = time.perf_counter() - started
        print(
            f"{label}: compile {m.grammar_compile_s:.3f} s, queue {m.queue_s:.3f} s, "
            f"prefill {m.prefill_s:.3f} s, decode {m.decode_s:.3f} s, total {total:.3f} s "
            f"({m.num_output_tokens} output tokens); compile share "
            f"{m.grammar_compile_s / total:.1%}"
        )
finally:
    engine.shutdown()
