"""The process-wide engine: built lazily, once per process, from settings.INFERENCE_ENGINE.

This is the one place Django settings become an EngineConfig. A worker's threads all share the
engine, so the decisions they run at once are batched by its loop. The engine is imported only
when first needed: the web server and management commands never load torch or the model.

For a block of work (the experiment's steps, a test that needs an empty cache) the engine is
built afresh with overrides on top of the settings (`engine_configured`); the overrides live
here, beside the engine, and never in Django's settings: `engine_settings` is what is in effect.
What the Django side may know of the live engine is an `EngineProfile`.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from inference.engine import EngineConfig, LLMEngine

logger = logging.getLogger(__name__)


def engine_settings() -> Any:
    """The engine arguments in effect in this process: settings.INFERENCE_ENGINE, with the
    overrides of the `engine_configured` block running, if one is, on top."""
    return _slot.settings()


def engine_config_from_settings() -> EngineConfig:
    """The engine arguments in effect (`engine_settings`) as an EngineConfig, or
    ImproperlyConfigured saying what to fix."""
    from inference.engine.config import EngineConfig

    kwargs = engine_settings()
    if not isinstance(kwargs, dict):
        raise ImproperlyConfigured(
            "INFERENCE_ENGINE must be a dict of EngineConfig arguments, "
            f"got {type(kwargs).__name__}"
        )
    known = EngineConfig.keyword_names()
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ImproperlyConfigured(
            f"INFERENCE_ENGINE has keys EngineConfig does not take: {unknown}; "
            f"the valid keys are {sorted(known)}"
        )
    # The disk tier's key is a secret: a setting of its own, so that INFERENCE_ENGINE (shown
    # in errors and logs) never holds it.
    key = getattr(settings, "INFERENCE_KV_DISK_KEY", None)
    try:
        if key is not None and "kv_disk_cache_key" not in kwargs:
            return EngineConfig(**kwargs, kv_disk_cache_key=key)
        return EngineConfig(**kwargs)
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"INFERENCE_ENGINE is invalid: {exc}{_tiers_hint(exc)} (POKOMACHI_MODEL, "
            "POKOMACHI_DEVICE and POKOMACHI_TP_* set it; POKOMACHI_KV_KEY the disk tier's key)"
        ) from exc


def _tiers_hint(exc: ValueError) -> str:
    """How to turn the disk tier off, for an error about the KV tiers."""
    return " (POKOMACHI_KV_DISK_DIR=off turns the disk tier off)" if "kv_" in str(exc) else ""


class _EngineSlot:
    """Holds this process's one engine; the lock makes the first build happen once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engine: LLMEngine | None = None
        self._overrides: dict[str, Any] | None = None  # an engine_configured block's

    def settings(self) -> Any:
        base, overrides = settings.INFERENCE_ENGINE, self._overrides
        if overrides is None or not isinstance(base, dict):
            return base
        return {**base, **overrides}

    def configure(self, overrides: dict[str, Any]) -> dict[str, Any] | None:
        """Put `overrides` on top of those in effect, for the next engine built; returns those
        in effect before, for `restore`."""
        with self._lock:
            previous = self._overrides
            self._overrides = {**(previous or {}), **overrides}
        return previous

    def restore(self, overrides: dict[str, Any] | None) -> None:
        with self._lock:
            self._overrides = overrides

    def get(self) -> LLMEngine:
        engine = self._engine
        if engine is not None and engine.failure is None:
            return engine
        with self._lock:
            if self._engine is not None and self._engine.failure is not None:
                # A tensor-parallel rank died: its requests failed; this one gets a new engine
                # (remote ranks rejoin once restarted, e.g. by their container's restart policy).
                logger.error("the engine failed (%s); starting a new one", self._engine.failure)
                self._engine.shutdown()
                self._engine = None
            if self._engine is None:
                self._engine = self._build()
            return self._engine

    def is_loaded(self) -> bool:
        return self._engine is not None

    def shutdown(self, log: bool = True) -> None:
        with self._lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            if log:
                logger.info("shutting the engine down")
            engine.shutdown()

    @staticmethod
    def _build() -> LLMEngine:
        from inference.engine import LLMEngine

        config = engine_config_from_settings()
        started = time.perf_counter()
        try:
            engine = LLMEngine(config)
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"the engine could not load with INFERENCE_ENGINE={engine_settings()}: {exc}"
                f"{_tiers_hint(exc)}"
            ) from exc
        logger.info(
            "engine loaded: model=%s device=%s in %.1f s",
            config.model,
            config.device,
            time.perf_counter() - started,
        )
        return engine


_slot = _EngineSlot()
# At exit the log streams may already be closed (pytest closes its captures): stop quietly.
atexit.register(_slot.shutdown, log=False)


def engine_get() -> LLMEngine:
    """This process's engine, built on first use (~10 s for the real model)."""
    return _slot.get()


def engine_is_loaded() -> bool:
    return _slot.is_loaded()


def engine_shutdown() -> None:
    """Stop this process's engine, if one was built; a later engine_get builds a fresh one."""
    _slot.shutdown()


@contextlib.contextmanager
def engine_configured(**overrides: Any) -> Iterator[LLMEngine]:
    """This process's engine, built afresh with `overrides` (EngineConfig arguments) on top of
    INFERENCE_ENGINE, for the duration of the block (the experiment runs each step on its own
    engine: its own retention interval, an empty cache: the KV tiers are off unless `overrides`
    turn them on, or the disk would hand one step the blocks of the step before). Afterwards
    the engine is shut down, and the next one is built as before the block. Django's settings
    are never touched: `engine_settings` says what is in effect meanwhile."""
    empty = {"kv_disk_cache_dir": None, "kv_host_cache_bytes": 0}
    previous = _slot.configure({**empty, **overrides})
    engine_shutdown()
    try:
        yield engine_get()
    finally:
        engine_shutdown()
        _slot.restore(previous)


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """What the Django side may know of this process's engine: its model, and whether some of
    its layers attend over a window (without them the retention interval changes nothing)."""

    model: str
    has_sliding_window_layers: bool


def engine_profile() -> EngineProfile:
    """The profile of this process's engine (built now if it is not yet)."""
    engine = engine_get()
    return EngineProfile(
        model=engine.config.model,
        has_sliding_window_layers=engine.has_sliding_window_layers,
    )


def engine_prompt_token_ids(messages: list[dict[str, Any]]) -> list[int]:
    """The token ids of a chat prompt (with the generation prompt), by this process's engine's
    tokenizer and chat template."""
    return list(engine_get().tokenizer.apply_chat_template(messages))


def engine_num_text_tokens(text: str) -> int:
    """How many tokens this process's engine's tokenizer makes of plain `text`."""
    return len(engine_get().tokenizer.encode(text))
