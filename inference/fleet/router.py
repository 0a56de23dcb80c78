"""Which node a request goes to (node routing; the WebSocket URL routes are Channels',
pokosite/routing.py): the routing policies, over the nodes' states (inference/fleet/health.py).
Pure: no Redis, no Django; the caller (inference/fleet/services.py: completion_route) reads the
states and gives each request its prompt prefixes (inference/fleet/prefixes.py) and an affinity
key (any stable string: the town passes one per resident; this module knows nothing of
residents).

Policies:
- `cache_aware` (the default), after SGLang's router: if the live nodes' loads are imbalanced —
  max − min > `balance_abs` AND max > `balance_rel` × min, both must hold — the request goes to
  the least loaded node. Otherwise to the node holding the longest prefix of its prompt (its
  longest cache breakpoint: for the town, the resident's own head first, then the shared head).
  Ties (equal match, or no node holds anything) go to the least loaded of the tied nodes, then by
  rendezvous hashing of the affinity key over the node names: stable, so a request keeps its
  node while nothing else changes, and a node that leaves or joins moves only its own share.
- `round_robin`: the next node in turn, one turn per request, the turn counter shared by the
  whole deployment (as SGLang's router's).
- `fixed`: the request's position in its batch modulo the nodes (the town's rule before
  routing: resident i on node i mod n).

Only live nodes are chosen. When none of the candidates is up (no worker has sent a heartbeat:
the town computing inline, or workers older than heartbeats), every policy falls back to
`fixed` over all of them, so the decision waits on its node's queue as it always did.

A `Router` routes a batch (one tick's decisions): what it sends to a node counts as that node's
load for the requests after it. Unlike SGLang's router, it does not count the prefixes it sent
as held there until the node's own heartbeat says so: in a tick every prompt is another
resident's, and counting the shared head as held on the first node it went to would send the
whole tick after it (a head every node computes once is not worth a queue).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from inference.fleet.health import NodeState
from inference.fleet.prefixes import PromptPrefix

POLICIES = ("cache_aware", "round_robin", "fixed")


@dataclass(frozen=True, slots=True)
class BalanceThresholds:
    """When cache affinity yields to load (SGLang's balance_abs_threshold and
    balance_rel_threshold): imbalanced when both max − min > `abs` and max > `rel` × min."""

    abs: int = 4
    rel: float = 1.5

    def __post_init__(self) -> None:
        if self.abs < 0:
            raise ValueError(f"the absolute balance threshold must be ≥ 0, got {self.abs}")
        if not self.rel >= 1.0:
            raise ValueError(f"the relative balance threshold must be ≥ 1, got {self.rel}")

    def imbalanced(self, loads: Sequence[int]) -> bool:
        if len(loads) < 2:
            return False
        high, low = max(loads), min(loads)
        return high - low > self.abs and high > self.rel * low


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """One request to route: its prompt's prefixes (shortest first, as prompt_prefixes gives
    them), a stable affinity key, and its position in its batch (for `fixed`)."""

    prefixes: tuple[PromptPrefix, ...]
    affinity_key: str
    position: int = 0


@dataclass(frozen=True, slots=True)
class RouteChoice:
    """Where a request goes and why: "cache" (longest held prefix), "affinity" (a tie: the least
    loaded, then the affinity hash), "balance" (the loads were imbalanced: least loaded),
    "round_robin", "fixed", or "no_live_node" (none up: the fixed rule over all)."""

    node: str
    reason: str
    num_matched_chars: int = 0


def affinity_rank(affinity_key: str, node: str) -> int:
    """Rendezvous (highest random weight) hashing: the node with the highest rank wins."""
    digest = hashlib.sha256(f"{affinity_key}\x00{node}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


@dataclass(slots=True)
class _Candidate:
    node: str
    load: int
    prefix_keys: frozenset[str] = frozenset()


class Router:
    """Routes the requests of one batch over `states` by `policy`.

    `first_turn`: for round_robin, the shared counter's value before this batch (the caller
    takes len(batch) turns from it, so concurrent batches do not share turns)."""

    def __init__(
        self,
        *,
        policy: str,
        states: Sequence[NodeState],
        thresholds: BalanceThresholds | None = None,
        first_turn: int = 0,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; use one of {', '.join(POLICIES)}")
        if not states:
            raise ValueError("no nodes to route to: a run lists at least one node")
        self.policy = policy
        self.thresholds = thresholds or BalanceThresholds()
        self._all = [s.node for s in states]
        self._live = [
            _Candidate(node=s.node, load=s.load, prefix_keys=s.prefix_keys)
            for s in states
            if s.is_up
        ]
        self._turn = first_turn

    def route(self, request: RouteRequest) -> RouteChoice:
        if not self._live:
            return RouteChoice(self._all[request.position % len(self._all)], "no_live_node")
        if self.policy == "fixed":
            # Today's rule over all the run's nodes; a down node's share goes to a live one.
            node = self._all[request.position % len(self._all)]
            chosen = self._by_node(node) or self._live[request.position % len(self._live)]
            choice = RouteChoice(chosen.node, "fixed")
        elif self.policy == "round_robin":
            chosen = self._live[self._turn % len(self._live)]
            self._turn += 1
            choice = RouteChoice(chosen.node, "round_robin")
        else:
            choice = self._cache_aware(request)
            chosen = self._by_node(choice.node)
        chosen.load += 1
        return choice

    def _by_node(self, node: str) -> _Candidate | None:
        return next((c for c in self._live if c.node == node), None)

    def _cache_aware(self, request: RouteRequest) -> RouteChoice:
        def stable(c: _Candidate) -> int:
            return affinity_rank(request.affinity_key, c.node)

        if self.thresholds.imbalanced([c.load for c in self._live]):
            least = min(c.load for c in self._live)
            chosen = max((c for c in self._live if c.load == least), key=stable)
            return RouteChoice(chosen.node, "balance", self._matched(chosen, request))
        matched = {c.node: self._matched(c, request) for c in self._live}
        best = max(matched.values())
        tied = [c for c in self._live if matched[c.node] == best]
        least = min(c.load for c in tied)
        chosen = max((c for c in tied if c.load == least), key=stable)
        reason = "cache" if best and len(tied) == 1 else "affinity"
        return RouteChoice(chosen.node, reason, best)

    @staticmethod
    def _matched(candidate: _Candidate, request: RouteRequest) -> int:
        """Characters of the longest prefix of the request's prompt the node holds."""
        return max(
            (p.num_chars for p in request.prefixes if p.key in candidate.prefix_keys), default=0
        )
