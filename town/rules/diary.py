"""Older diary lines for a resident: what makes a prompt as long as the talk's.

The talk's prompts averaged ~12,000 tokens, most of it per resident (history, relations).
The experiment scales prompts to this machine and keeps the talk's proportions by giving each
resident a diary of `num_chars` characters, built deterministically from the run's seed and
the town's own places, people and menus, so two runs with the same seed see the same text.
"""

from __future__ import annotations

import random

from town.rules.world import ResidentView, World

_TIMES = ("early morning", "morning", "late morning", "noon", "afternoon", "evening", "night")
_MOODS = ("tired", "cheerful", "quiet", "restless", "content", "curious", "sleepy", "busy")
_TOPICS = (
    "the summer festival",
    "the new train timetable",
    "the cat at the kissaten",
    "rain coming next week",
    "a book about old Edo",
    "the shrine's autumn fair",
    "prices going up",
    "a trip to the city",
    "the river cleaning day",
    "a recipe for curry pan",
)


def diary_lines(*, world: World, resident: ResidentView, seed: int, num_chars: int) -> list[str]:
    """Diary lines, oldest day first, adding up to about `num_chars` characters."""
    if num_chars <= 0:
        return []
    rng = random.Random(f"{seed}:{resident.id}")
    places = [p for p in world.places if not p.is_home]
    others = [r.name for r in world.residents if r.id != resident.id] or ["a neighbour"]
    lines: list[str] = []
    total = 0
    day = 1
    while total < num_chars:
        place = rng.choice(places)
        item = rng.choice(place.menu).item if place.menu else None
        what = f"bought {item} at {place.name}" if item else f"spent time at {place.name}"
        line = (
            f"Diary, {day} days ago, {rng.choice(_TIMES)}: felt {rng.choice(_MOODS)}; {what}; "
            f"talked with {rng.choice(others)} about {rng.choice(_TOPICS)}."
        )
        lines.append(line)
        total += len(line) + 1
        day += 1
    return list(reversed(lines))
