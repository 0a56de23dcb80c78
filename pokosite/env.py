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
