"""The one parser of environment variables, for the settings and the launcher alike.

Each reader takes a name and a default (unset or blank: the default) and an optional mapping
(the process's environment by default: the launcher reads the one it hands its children). A
malformed value raises EnvError, a ValueError whose message names the variable and says what it
takes; the launcher answers it as a LaunchError, the settings let it stop the start.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


class EnvError(ValueError):
    """An environment variable holds what its reader cannot take; the message says what can."""


def _raw(name: str, env: Mapping[str, str] | None) -> str | None:
    raw = (os.environ if env is None else env).get(name)
    return None if raw is None or raw == "" else raw


def env_str(name: str, default: str = "", *, env: Mapping[str, str] | None = None) -> str:
    """The value stripped of blanks; unset or blank: `default`."""
    raw = _raw(name, env)
    return default if raw is None or not raw.strip() else raw.strip()


def env_bool(name: str, default: bool, *, env: Mapping[str, str] | None = None) -> bool:
    raw = _raw(name, env)
    if raw is None:
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise EnvError(f"{name}={raw!r}: use one of 1/0, true/false, yes/no, on/off")


def env_int(
    name: str,
    default: int,
    *,
    low: int | None = None,
    high: int | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """A whole number, within low..high when they are given."""
    raw = _raw(name, env)
    if raw is None or not raw.strip():
        return default
    bounded = low is not None and high is not None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or (bounded and not low <= value <= high):
        where = f" from {low} to {high}" if bounded else ""
        raise EnvError(f"{name}={raw!r}: must be a whole number{where}")
    return value


def env_float(name: str, default: float, *, env: Mapping[str, str] | None = None) -> float:
    """A number of seconds."""
    raw = _raw(name, env)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r}: must be a number of seconds") from None


def env_list(name: str, default: list[str], *, env: Mapping[str, str] | None = None) -> list[str]:
    """A comma-separated list; blanks around names are dropped."""
    raw = _raw(name, env)
    if raw is None or not raw.strip():
        return list(default)
    return [part.strip() for part in raw.split(",") if part.strip()]


def env_retention_interval(name: str, *, env: Mapping[str, str] | None = None) -> int | None:
    """Tokens between kept window checkpoints; unset or "dense": one at every block (None)."""
    raw = (_raw(name, env) or "").strip().lower()
    if raw in ("", "dense"):
        return None
    try:
        return int(raw)
    except ValueError:
        raise EnvError(
            f"{name}={raw!r}: must be a whole number of tokens (a multiple of the block size, "
            "16), 0 (only at the end of each prompt) or 'dense'"
        ) from None


def env_tensor_parallel(*, env: Mapping[str, str] | None = None) -> dict[str, object]:
    """EngineConfig keywords for one model over several processes or machines (the engine's
    distributed/ package): POKOMACHI_TP_SIZE ranks, this worker's engine being rank 0; the
    others spawned here (POKOMACHI_TP_LAUNCH=spawn) or started on other machines (external)
    and meeting rank 0 at POKOMACHI_TP_MASTER_ADDR:POKOMACHI_TP_MASTER_PORT. Unset: {}."""
    size = env_int("POKOMACHI_TP_SIZE", 1, low=1, high=1024, env=env)
    if size == 1:
        return {}
    launch = env_str("POKOMACHI_TP_LAUNCH", "spawn", env=env)
    if launch not in ("spawn", "external"):
        raise EnvError(f"POKOMACHI_TP_LAUNCH={launch!r}: use spawn or external")
    keywords: dict[str, object] = {
        "tensor_parallel_size": size,
        "worker_launch": launch,
        "master_addr": env_str("POKOMACHI_TP_MASTER_ADDR", "127.0.0.1", env=env),
        "enable_expert_parallel": env_bool("POKOMACHI_EXPERT_PARALLEL", False, env=env),
        "distributed_timeout_s": env_float("POKOMACHI_TP_TIMEOUT_S", 120.0, env=env),
    }
    if env_str("POKOMACHI_TP_MASTER_PORT", env=env):
        keywords["master_port"] = env_int("POKOMACHI_TP_MASTER_PORT", 0, low=1, high=65535, env=env)
    elif launch == "external":
        raise EnvError("POKOMACHI_TP_LAUNCH=external needs POKOMACHI_TP_MASTER_PORT")
    return keywords
