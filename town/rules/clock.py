"""The simulated clock: minutes since day 1 00:00 → day, time of day, phase, opening hours."""

from __future__ import annotations

from dataclasses import dataclass

MINUTES_PER_DAY = 24 * 60

# (phase, first minute of the day it covers); night wraps past midnight.
_PHASES = (("night", 0), ("morning", 5 * 60), ("noon", 11 * 60), ("evening", 16 * 60))
_NIGHT_FROM = 21 * 60


@dataclass(frozen=True, slots=True)
class Clock:
    minutes: int  # since day 1, 00:00

    @property
    def day(self) -> int:
        return 1 + self.minutes // MINUTES_PER_DAY

    @property
    def minute_of_day(self) -> int:
        return self.minutes % MINUTES_PER_DAY

    @property
    def phase(self) -> str:
        minute = self.minute_of_day
        if minute >= _NIGHT_FROM:
            return "night"
        return [name for name, start in _PHASES if minute >= start][-1]

    @property
    def hhmm(self) -> str:
        return minutes_to_hhmm(self.minute_of_day)

    def label(self) -> str:
        return f"Day {self.day}, {self.hhmm} ({self.phase})"


def clock_at(*, start_minutes: int, minutes_per_tick: int, tick_index: int) -> Clock:
    return Clock(start_minutes + minutes_per_tick * tick_index)


def minutes_to_hhmm(minute_of_day: int) -> str:
    return f"{minute_of_day // 60:02d}:{minute_of_day % 60:02d}"


def is_open_at(*, opens_at: int, closes_at: int, minute_of_day: int) -> bool:
    """Opening hours as minutes of the day; closes_at < opens_at means open past midnight,
    opens_at == closes_at means always open."""
    if opens_at == closes_at:
        return True
    if opens_at < closes_at:
        return opens_at <= minute_of_day < closes_at
    return minute_of_day >= opens_at or minute_of_day < closes_at


def hours_label(*, opens_at: int, closes_at: int) -> str:
    if opens_at == closes_at:
        return "always open"
    return f"{_short_time(opens_at)}-{_short_time(closes_at)}"


def _short_time(minute_of_day: int) -> str:
    hours, minutes = divmod(minute_of_day, 60)
    return f"{hours}" if minutes == 0 else f"{hours}:{minutes:02d}"
