"""Which node a decision goes to: inference routes it (inference/services.py: completion_route)
by the run's routing policy over the live states of the run's nodes.

A tick's decisions are routed together when the tick begins (`decisions_route`), in resident
order: each is the decision's completion request, the resident its affinity key, so a resident
keeps its node while the loads stay even. A decision whose node went down is routed again,
alone, over the nodes still up (`decision_node_replacement`); the tick loop sends it there
(services/decisions.py: decision_reroute).
"""

from __future__ import annotations

from collections.abc import Sequence

from inference.fleet.health import NodeState
from inference.services import RouteChoice, completion_node_replacement, completion_route
from town.models import Decision, Run
from town.services.decisions import decision_completion_request


def decisions_route(
    *, run: Run, decisions: Sequence[Decision], states: Sequence[NodeState] | None = None
) -> list[RouteChoice]:
    """Set each decision's node (not saved), the decisions in resident order."""
    # Routing reads the prompt and the affinity key, not the seed (a query per resident).
    requests = [decision_completion_request(decision=d, run=run, seed=None) for d in decisions]
    choices = completion_route(
        requests=requests, nodes=run.nodes, policy=run.routing, states=states
    )
    for decision, choice in zip(decisions, choices, strict=True):
        decision.node = choice.node
    return choices


def decision_node_replacement(
    *, run: Run, decision: Decision, states: Sequence[NodeState]
) -> str | None:
    """A live node for a decision whose node is down, by the run's policy over the nodes still
    up; None when its node is up, or when no node is (then it waits for its own)."""
    return completion_node_replacement(
        request=decision_completion_request(decision=decision, run=run, seed=None),
        node=decision.node,
        policy=run.routing,
        states=states,
        position=decision.resident_id,
    )
