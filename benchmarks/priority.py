"""`python -m benchmarks priority`: a script's request while the town decides (issue 34, item 2).
The time to first token of a short /v1-like chat request on an idle engine, then with the town's
decisions in flight (`--concurrency` town-shaped prompts, the JSON schema, submitted together as
a tick's fan-out), once in the same class as the town (FCFS: it waits behind the batch) and once
ahead of it (priority 0 against the town's 1, as the Django side sends them by default).

Each measurement is repeated `--repeats` times on one engine configured as the app runs it
(pokosite/settings: a 256-token prefill chunk while a request decodes); every probe has its own
cache salt, so no probe reuses another's prompt. The probe is submitted once every town request
is running and `PROBE_DELAY_S` has passed (the town is mid-prefill: its worst moment).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from dataclasses import dataclass

from benchmarks.lib.cli import add_arguments, run_meta
from benchmarks.lib.output import emit, progress
from benchmarks.lib.workload import build_workload, chat_tokenizer_for
from inference.engine import EngineConfig, LLMEngine, SamplingParams

PROBE = [
    {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
    {"role": "user", "content": "Name a quiet place in a small Japanese town to read a book."},
]
PROBE_TOKENS = 24  # as the issue's /v1 call
PROBE_DELAY_S = 0.5
TOWN_PRIORITY, PROBE_PRIORITY = 1, 0


@dataclass(slots=True)
class PriorityResult:
    case: str  # "idle" | "town, same class" | "town, ahead"
    ttft_s: list[float]

    @property
    def median_s(self) -> float:
        return statistics.median(self.ttft_s)


def _probe(engine: LLMEngine, salt: str, priority: int) -> float:
    params = SamplingParams(max_tokens=PROBE_TOKENS, temperature=0.0, cache_salt=salt)
    (output,) = engine.generate([PROBE], params, priority=priority)
    return output.metrics.ttft_s


def _under_load(
    engine: LLMEngine, town: list, schema: dict, max_tokens: int, salt: str, ahead: bool
) -> float:
    """The probe's TTFT with the town's requests in flight; waits for them to finish."""
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, json_schema=schema
    )
    town_priority = TOWN_PRIORITY if ahead else PROBE_PRIORITY
    batch = threading.Thread(
        target=engine.generate, args=(town, params), kwargs={"priority": town_priority}
    )
    batch.start()
    deadline = time.monotonic() + 60
    while engine.stats().num_running < len(town):
        if time.monotonic() > deadline:
            raise RuntimeError("the town's requests were not all admitted within 60 s")
        time.sleep(0.005)
    time.sleep(PROBE_DELAY_S)
    ttft = _probe(engine, salt, PROBE_PRIORITY)
    batch.join()
    return ttft


def run_priority(
    model: str,
    *,
    num_town: int,
    head_tokens: int,
    prompt_token_range: tuple[int, int],
    max_tokens: int,
    repeats: int,
    seed: int,
    max_num_batched_tokens: int | None = None,
) -> list[PriorityResult]:
    config = dict(model=model, prefill_chunk_while_decoding=256)
    if max_num_batched_tokens is not None:
        config["max_num_batched_tokens"] = max_num_batched_tokens
    engine = LLMEngine(EngineConfig(**config))
    try:
        workload = build_workload(
            chat_tokenizer_for(engine.tokenizer),
            num_requests=num_town * repeats,
            head_tokens=head_tokens,
            prompt_token_range=prompt_token_range,
            seed=seed,
        )
        # First-step costs (grammar compile, kernels' first calls) out of the numbers: one
        # idle probe and one round under load, not counted.
        _probe(engine, "warm-up", PROBE_PRIORITY)
        warm = build_workload(
            chat_tokenizer_for(engine.tokenizer),
            num_requests=num_town,
            head_tokens=head_tokens,
            prompt_token_range=prompt_token_range,
            seed=seed + 1,
        )
        _under_load(engine, warm.requests, warm.schema, max_tokens, "warm-up-load", True)
        results = [PriorityResult(case, []) for case in ("idle", "town, same class", "town, ahead")]
        for repeat in range(repeats):
            town = workload.requests[repeat * num_town : (repeat + 1) * num_town]
            progress(f"priority: repeat {repeat + 1}/{repeats}")
            results[0].ttft_s.append(_probe(engine, f"idle-{repeat}", PROBE_PRIORITY))
            for result, ahead in ((results[1], False), (results[2], True)):
                salt = f"{result.case}-{repeat}"
                ttft = _under_load(engine, town, workload.schema, max_tokens, salt, ahead)
                result.ttft_s.append(ttft)
            progress(
                "priority: TTFT idle {:.3f} s, same class {:.3f} s, ahead {:.3f} s".format(
                    *(r.ttft_s[-1] for r in results)
                )
            )
        return results
    finally:
        engine.shutdown()


def format_priority(results: list[PriorityResult], num_town: int) -> str:
    idle = results[0].median_s
    lines = [f"{'probe TTFT (24 tokens)':<34}{'median (s)':>12}{'× idle':>9}   each (s)"]
    for r in results:
        each = ", ".join(f"{t:.3f}" for t in r.ttft_s)
        label = r.case if r.case == "idle" else f"{r.case} ({num_town} in flight)"
        lines.append(f"{label:<34}{r.median_s:>12.3f}{r.median_s / idle:>9.2f}   {each}")
    lines.append(f"ahead of the town: {results[2].median_s / idle:.2f}× idle (target ≤ 1.5×)")
    return "\n".join(lines)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    add_arguments(
        parser,
        "model",
        "concurrency",
        "head_tokens",
        "prompt_tokens",
        "max_tokens",
        "repeats",
        "seed",
        "max_num_batched_tokens",
        "json",
        "json_out",
    )


def main(args: argparse.Namespace) -> int:
    meta = run_meta(args)
    results = run_priority(
        args.model,
        num_town=args.concurrency,
        head_tokens=args.head_tokens,
        prompt_token_range=args.prompt_tokens,
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        seed=args.seed,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    data = {**meta, "runs": [{"case": r.case, "ttft_s": r.ttft_s} for r in results]}
    return emit(args, data, format_priority(results, args.concurrency))
