"""Which node a decision goes to: the run's routing policy (inference/routing.py) over the live
states of its nodes (inference/node_health.py).

A tick's decisions are routed together when the tick begins (`decisions_route`), in resident
order: each request is the decision's prompt prefixes (the shared head, then the resident's own
head where the layout has one) and the resident as its affinity key, so a resident keeps its
node while the loads stay even. A decision whose node went down is routed again, alone, over
the nodes still up (`decision_node_replacement`); the tick loop sends it there
(services/decisions.py: decision_reroute).
"""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings

from inference.node_health import NodeState, heartbeat_store, node_states
from inference.prefixes import prompt_prefixes
from inference.routing import BalanceThresholds, RouteChoice, Router, RouteRequest
from town.models import Decision, Run
from town.services.decisions import decision_cache_salt


def route_request(*, run: Run, decision: Decision, position: int) -> RouteRequest:
    return RouteRequest(
        prefixes=tuple(prompt_prefixes(decision.messages, decision_cache_salt(run))),
        affinity_key=f"resident:{decision.resident_id}",
        position=position,
    )


def _router(*, run: Run, states: Sequence[NodeState], num_requests: int) -> Router:
    first_turn = 0
    if run.routing == Run.Routing.ROUND_ROBIN and any(s.is_up for s in states):
        # The deployment's one counter: this batch takes the next num_requests turns.
        first_turn = heartbeat_store().turn("round_robin", by=num_requests) - num_requests
    return Router(
        policy=run.routing,
        states=states,
        thresholds=BalanceThresholds(
            abs=settings.INFERENCE_ROUTING_BALANCE_ABS, rel=settings.INFERENCE_ROUTING_BALANCE_REL
        ),
        first_turn=first_turn,
    )


def decisions_route(
    *, run: Run, decisions: Sequence[Decision], states: Sequence[NodeState] | None = None
) -> list[RouteChoice]:
    """Set each decision's node (not saved), the decisions in resident order."""
    states = node_states(run.nodes) if states is None else states
    router = _router(run=run, states=states, num_requests=len(decisions))
    choices = []
    for position, decision in enumerate(decisions):
        choice = router.route(route_request(run=run, decision=decision, position=position))
        decision.node = choice.node
        choices.append(choice)
    return choices


def decision_node_replacement(
    *, run: Run, decision: Decision, states: Sequence[NodeState]
) -> str | None:
    """A live node for a decision whose node is down, by the run's policy over the nodes still
    up; None when its node is up, or when no node is (then it waits for its own)."""
    live = [s for s in states if s.is_up]
    if not live or any(s.node == decision.node for s in live):
        return None
    router = _router(run=run, states=live, num_requests=1)
    request = route_request(run=run, decision=decision, position=decision.resident_id)
    return router.route(request).node
