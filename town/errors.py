"""The town's own error types: what a caller did wrong, and how to fix it."""


class TownError(Exception):
    """Base of every error the town raises on bad input or a bad request."""


class RunStateError(TownError):
    """A run control that the run's current state does not allow (e.g. pausing a stopped run)."""


class TownRuleError(TownError):
    """An action the town's rules forbid (a closed place, a full place, not enough money)."""
