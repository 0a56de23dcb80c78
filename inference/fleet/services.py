"""Where completions go: each request routed to a node of the fleet, in the tick loop's process
(the node's worker then runs completion_generate, inference/completions/services.py). The
policy's Router (inference/fleet/router.py) runs over the nodes' states
(inference/fleet/health.py), matching the request's prompt prefixes (inference/fleet/prefixes.py:
hashed there and only there) against what each node served. The town reaches these through its
door, inference/services.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings

from inference.completions.types import CompletionRequest
from inference.fleet.health import NodeState, heartbeat_store, node_states
from inference.fleet.prefixes import prompt_prefixes
from inference.fleet.router import BalanceThresholds, RouteChoice, Router, RouteRequest


def _route_request(request: CompletionRequest, position: int) -> RouteRequest:
    return RouteRequest(
        prefixes=tuple(prompt_prefixes(request.messages, request.cache_salt)),
        affinity_key=request.affinity_key or "",
        position=position,
    )


def _router(*, policy: str, states: Sequence[NodeState], num_requests: int) -> Router:
    first_turn = 0
    if policy == "round_robin" and any(s.is_up for s in states):
        # The deployment's one counter: this batch takes the next num_requests turns.
        first_turn = heartbeat_store().turn("round_robin", by=num_requests) - num_requests
    return Router(
        policy=policy,
        states=states,
        thresholds=BalanceThresholds(
            abs=settings.INFERENCE_ROUTING_BALANCE_ABS, rel=settings.INFERENCE_ROUTING_BALANCE_REL
        ),
        first_turn=first_turn,
    )


def completion_route(
    *,
    requests: Sequence[CompletionRequest],
    nodes: Sequence[str],
    policy: str,
    states: Sequence[NodeState] | None = None,
) -> list[RouteChoice]:
    """The node each request goes to, by `policy` over `nodes` (their live states, read now
    unless `states` are given), the requests routed together in order: what goes to a node
    counts as its load for the requests after it, and a request's position is its place in
    `requests` (the `fixed` policy's rule)."""
    states = node_states(nodes) if states is None else states
    router = _router(policy=policy, states=states, num_requests=len(requests))
    return [router.route(_route_request(request, i)) for i, request in enumerate(requests)]


def completion_node_replacement(
    *,
    request: CompletionRequest,
    node: str,
    policy: str,
    states: Sequence[NodeState],
    position: int,
) -> str | None:
    """A live node for a request sent to `node`, which is down: routed alone by `policy` over
    the nodes of `states` still up (`position`: its place for the `fixed` rule). None when
    `node` is up, or when no node is (then it waits for its own)."""
    live = [s for s in states if s.is_up]
    if not live or any(s.node == node for s in live):
        return None
    router = _router(policy=policy, states=live, num_requests=1)
    return router.route(_route_request(request, position)).node
