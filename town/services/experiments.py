"""The talk's experiment: the same town, from the same seed, once per step of the talk.

Each step is a stored Run with its own prompt layout and its own engine (this process's, built
afresh with the step's retention interval, so no step reuses another's cache). Prompt sizes are
scaled to this machine: the scale is our shared head at step 2 over the talk's (2,247 tokens),
the retention intervals shrink by the same factor, and each resident gets a diary long enough
that prompts keep the talk's proportions (~12,172 tokens at step 2, scaled).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from inference.services import (
    completion_engine_configured,
    completion_head_unpin,
    completion_head_warm,
    completion_num_text_tokens,
    completion_prompt_token_ids,
)
from town.errors import TownError
from town.models import Run, Tick, Town
from town.rules.diary import diary_lines
from town.rules.prompts import num_shared_messages, prompt_build
from town.selectors import tick_failure, world_load
from town.services.decisions import decision_cache_salt
from town.services.runs import run_create, run_lease_release, run_start
from town.simulation import InlineSend, lease_owner_name, tick_run

logger = logging.getLogger(__name__)

TALK_HEAD_TOKENS = 2247  # the talk's shared head once the shared part moved to the front
TALK_PROMPT_TOKENS = 12172  # the talk's mean prompt at that step
BLOCK_SIZE = 16  # retention intervals are multiples of the engine's block size


@dataclass(frozen=True, slots=True)
class ExperimentStep:
    number: int
    change: str  # what the talk changed at this step
    layout: str
    talk_interval: int  # the talk's retention interval, tokens
    # Our engine's own best: cache breakpoints from the prompts' "cache" marks, token-exact
    # reuse, junction checkpoints, one prefill per shared head, the window kept at every token
    # (dense), and the tick's shared head warmed and pinned before its decisions fan out. Its
    # layout is part of it: each resident's own head (profile, diary) is reused across ticks.
    best_engine: bool = False


TALK_STEPS = (
    ExperimentStep(1, "start: naive layout, retention 4,096", "naive", 4096),
    ExperimentStep(2, "shared part moved to the head", "shared_rules", 4096),
    ExperimentStep(3, "retention 4,096 → 2,048", "shared_rules", 2048),
    ExperimentStep(4, "shop info at the head, as a table", "shared_head", 2048),
    ExperimentStep(5, "retention 2,048 → 1,024", "shared_head", 1024),
    ExperimentStep(6, "output format only in the schema", "shared_head_schema_only", 1024),
    ExperimentStep(
        7,
        "ours: each resident's own cached head (layout), breakpoints, exact reuse, warm "
        "pinned shared head",
        "shared_then_resident_head",
        1024,
        True,
    ),
)
PRESETS = {"talk": TALK_STEPS}


@dataclass(slots=True)
class Scaling:
    """How the talk's sizes map onto this run of the experiment."""

    scale: float
    head_tokens: int  # our shared head at step 2 (common prefix of two residents' prompts)
    prompt_tokens_before: int  # mean prompt at step 2 without a diary
    diary_chars: int
    intervals: dict[int, int] = field(default_factory=dict)  # talk interval → ours

    def interval(self, talk_interval: int) -> int:
        return self.intervals[talk_interval]

    def describe(self) -> str:
        pairs = ", ".join(f"{t:,} → {o:,}" for t, o in sorted(self.intervals.items(), reverse=True))
        target = round(TALK_PROMPT_TOKENS * self.scale)
        return (
            f"scaled ×{self.scale:.3f} to this machine: the talk's shared head {TALK_HEAD_TOKENS:,}"
            f" → ours {self.head_tokens:,} tokens; retention intervals {pairs}; prompts "
            f"~{TALK_PROMPT_TOKENS:,} → ~{target:,} tokens (each resident's diary: "
            f"{self.diary_chars:,} characters)"
        )


@dataclass(slots=True)
class StepResult:
    step: ExperimentStep
    run: Run
    retention_interval: int | None  # None: a window checkpoint at every block


@dataclass(slots=True)
class Experiment:
    model: str
    has_sliding_window_layers: bool  # without them the retention interval changes nothing
    scaling: Scaling
    steps: list[StepResult]


Progress = Callable[[str], None]


def scaled_interval(talk_interval: int, scale: float) -> int:
    """The talk's interval times `scale`, rounded down to whole blocks (at least one)."""
    return max(BLOCK_SIZE, int(talk_interval * scale) // BLOCK_SIZE * BLOCK_SIZE)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def experiment_scaling(
    *, town: Town, num_residents: int, seed: int, scale: float | None
) -> Scaling:
    """Measure our step-2 head and prompt with this process's engine's tokenizer; derive the
    scaling.

    Uses a probe run that is rolled back: nothing is stored."""
    with transaction.atomic():
        probe = run_create(town=town, layout="shared_rules", seed=seed, num_residents=num_residents)
        world = world_load(run=probe, tick_index=0)
        transaction.set_rollback(True)
    residents = world.residents[:2]
    ids = [
        completion_prompt_token_ids(
            messages=prompt_build(world=world, resident=r, layout="shared_rules").messages
        )
        for r in residents
    ]
    head = _common_prefix(ids[0], ids[1])
    prompt = sum(len(x) for x in ids) // len(ids)
    scale = scale if scale is not None else head / TALK_HEAD_TOKENS
    # Characters per token of diary text, measured on a sample of it.
    sample = "\n".join(diary_lines(world=world, resident=residents[0], seed=seed, num_chars=4000))
    chars_per_token = len(sample) / max(1, completion_num_text_tokens(text=sample))
    missing = max(0, round(TALK_PROMPT_TOKENS * scale) - prompt)
    return Scaling(
        scale=scale,
        head_tokens=head,
        prompt_tokens_before=prompt,
        diary_chars=int(missing * chars_per_token),
        intervals={s.talk_interval: scaled_interval(s.talk_interval, scale) for s in TALK_STEPS},
    )


def _run_ticks(*, run: Run, ticks: int, warm_head: bool) -> Run:
    send = InlineSend(max_workers=run.concurrency)
    owner = lease_owner_name("experiment")
    pins: list[int] = []

    def warm(tick: Tick) -> None:
        """Pin this tick's shared head (the first decision's messages up to its last shared
        cache breakpoint: the same for every resident) before the decisions fan out."""
        first = tick.decisions.order_by("resident_id").first()
        num_shared = num_shared_messages(first.messages)
        if not num_shared:
            return
        while pins:
            completion_head_unpin(handle=pins.pop())
        head = [{"role": m["role"], "content": m["content"]} for m in first.messages[:num_shared]]
        pins.append(completion_head_warm(messages=head, cache_salt=decision_cache_salt(run)))

    run = run_start(run=run)
    try:
        for _ in range(ticks):
            tick = tick_run(
                run_id=run.pk, send=send, owner=owner, before_decide=warm if warm_head else None
            )
            if tick is None:
                raise TownError(f"run {run.pk} is being advanced by another process")
            failure = tick_failure(tick=tick)
            if failure is not None:
                raise TownError(failure)
    finally:
        run_lease_release(run=run, owner=owner)
        send.shutdown()
    run.refresh_from_db()
    return run


# Steps 1–6 model the engine the talk used (vLLM): reuse rounds down to the block and the
# retention grid, "cache" marks are ignored, concurrent requests each prefill their head.
# Step 7 turns our engine's answers on.
_VLLM_LIKE = {
    "enable_chat_breakpoints": False,
    "enable_partial_block_reuse": False,
    "enable_junction_checkpoints": False,
    "enable_shared_prefill": False,
}


def _features(step: ExperimentStep) -> dict[str, bool]:
    return {name: step.best_engine for name in _VLLM_LIKE}


def experiment_run(
    *,
    town: Town,
    model: str | None,
    ticks: int,
    num_residents: int,
    seed: int,
    scale: float | None = None,
    steps: tuple[ExperimentStep, ...] = TALK_STEPS,
    progress: Progress | None = None,
) -> Experiment:
    """Run every step, each on a fresh engine of this process, and store each as a Run."""
    if ticks < 1:
        raise TownError(f"ticks must be at least 1, got {ticks}")
    if num_residents < 2:
        raise TownError(
            f"the experiment needs at least 2 residents (they share the head), got {num_residents}"
        )
    say = progress or (lambda text: None)
    base: dict[str, Any] = {"model": model} if model else {}
    with completion_engine_configured(overrides=base) as profile:
        scaling = experiment_scaling(town=town, num_residents=num_residents, seed=seed, scale=scale)
    say(scaling.describe())
    results = []
    for step in steps:
        # Step 7 keeps the window at every block (dense; with exact reuse, a checkpoint at every
        # token): our engine's answer to the retention grid, at the memory cost vLLM's interval
        # exists to avoid.
        interval = None if step.best_engine else scaling.interval(step.talk_interval)
        overrides = {**base, "retention_interval": interval, **_features(step)}
        with completion_engine_configured(overrides=overrides):
            run = run_create(
                town=town,
                layout=step.layout,
                seed=seed,
                ticks_target=ticks,
                retention_interval=interval,
                num_residents=num_residents,
                diary_chars=scaling.diary_chars,
                temperature=0.0,  # greedy: the steps' outputs are compared with each other
            )
            say(
                f"step {step.number}: {step.change} — run {run.pk}, layout {step.layout}, "
                f"retention {interval or 'dense'}"
            )
            run = _run_ticks(run=run, ticks=ticks, warm_head=step.best_engine)
            results.append(StepResult(step, run, interval))
    return Experiment(profile.model, profile.has_sliding_window_layers, scaling, results)
