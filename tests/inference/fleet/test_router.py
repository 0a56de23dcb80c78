"""The routing policies on crafted node states (inference/fleet/router.py), the prompt prefix keys
they match on (inference/fleet/prefixes.py), how heartbeats become node states
(inference/fleet/health.py), and the services the town routes through (inference/services.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from inference.completions.types import CompletionRequest
from inference.fleet.health import NodeHeartbeat, NodeState, node_states_from
from inference.fleet.prefixes import ServedPrefixes, prompt_prefixes
from inference.fleet.router import POLICIES, BalanceThresholds, Router, RouteRequest
from inference.services import completion_node_replacement, completion_route
from town.models import Run

SHARED = {"role": "system", "content": "rules " * 100, "cache": True}


def _own(name: str) -> dict:
    return {
        "role": "system",
        "content": f"{name}'s diary " * 50,
        "cache": True,
        "scope": "resident",
    }


def _prompt(name: str, salt: str = "run-1") -> RouteRequest:
    messages = [SHARED, _own(name), {"role": "user", "content": f"{name}, what now?"}]
    return RouteRequest(prefixes=tuple(prompt_prefixes(messages, salt)), affinity_key=name)


def _state(node: str, *, load: int = 0, holds: list[RouteRequest] = (), up: bool = True):
    keys = frozenset(p.key for r in holds for p in r.prefixes)
    return NodeState(node=node, is_up=up, num_waiting=load, prefix_keys=keys)


def test_prefix_keys_end_at_breakpoints_chain_and_depend_on_the_salt():
    a, b = _prompt("aiko"), _prompt("ben")
    assert len(a.prefixes) == 2  # the shared head, then the resident's own head
    assert a.prefixes[0] == b.prefixes[0]  # one shared head
    assert a.prefixes[1].key != b.prefixes[1].key
    assert a.prefixes[1].num_chars > a.prefixes[0].num_chars
    assert _prompt("aiko", salt="run-2").prefixes[0].key != a.prefixes[0].key
    # The key of a longer prefix covers what comes before it.
    changed_head = [{**SHARED, "content": "other rules"}, _own("aiko")]
    assert prompt_prefixes(changed_head, "run-1")[1].key != a.prefixes[1].key


def test_cache_aware_prefers_the_node_holding_the_residents_own_head():
    aiko = _prompt("aiko")
    shared_only = RouteRequest(prefixes=aiko.prefixes[:1], affinity_key="x")
    states = [_state("a", holds=[shared_only]), _state("b", holds=[aiko])]
    choice = Router(policy="cache_aware", states=states).route(aiko)
    assert (choice.node, choice.reason) == ("b", "cache")
    assert choice.num_matched_chars == aiko.prefixes[1].num_chars


def test_cache_aware_falls_back_to_the_shared_head():
    aiko = _prompt("aiko")
    states = [_state("a"), _state("b", holds=[_prompt("ben")])]
    choice = Router(policy="cache_aware", states=states).route(aiko)
    assert (choice.node, choice.reason) == ("b", "cache")
    assert choice.num_matched_chars == aiko.prefixes[0].num_chars


def test_ties_go_by_the_affinity_hash_whatever_the_order_of_nodes():
    names = [f"resident-{i}" for i in range(20)]
    forward = [Router(policy="cache_aware", states=[_state("a"), _state("b")]) for _ in names]
    backward = [Router(policy="cache_aware", states=[_state("b"), _state("a")]) for _ in names]
    nodes_f = [r.route(_prompt(n)).node for r, n in zip(forward, names, strict=True)]
    nodes_b = [r.route(_prompt(n)).node for r, n in zip(backward, names, strict=True)]
    assert nodes_f == nodes_b
    assert set(nodes_f) == {"a", "b"}  # the hash spreads residents


def test_an_imbalanced_node_gets_no_new_request_until_the_loads_even_out():
    aiko = _prompt("aiko")
    thresholds = BalanceThresholds(abs=4, rel=1.5)
    states = [_state("a", load=10, holds=[aiko]), _state("b", load=0)]
    router = Router(policy="cache_aware", states=states, thresholds=thresholds)
    choices = [router.route(_prompt(f"r{i}")) for i in range(8)]
    # b takes requests until a - b <= 4 (a's 10 vs b's 6); then the cache decides again (a holds
    # the shared head), which tips the loads over once more (11 vs 6).
    assert [(c.node, c.reason) for c in choices] == [("b", "balance")] * 6 + [
        ("a", "cache"),
        ("b", "balance"),
    ]


def test_both_thresholds_must_be_passed_to_call_loads_imbalanced():
    t = BalanceThresholds(abs=4, rel=1.5)
    assert t.imbalanced([10, 5])  # 5 > 4 and 10 > 7.5
    assert not t.imbalanced([9, 5])  # 4 is not > 4
    assert not t.imbalanced([100, 95])  # 100 < 1.5 * 95
    assert not t.imbalanced([3])
    with pytest.raises(ValueError, match="relative"):
        BalanceThresholds(rel=0.5)


def test_what_a_router_sends_counts_as_load_not_as_cache():
    """A cold tick spreads over the nodes: a shared head sent to one node does not pull the
    requests after it there (each node computes it once); a resident's own head held by a node
    does."""
    router = Router(policy="cache_aware", states=[_state("a"), _state("b")])
    cold = [router.route(_prompt(f"r{i}")) for i in range(6)]
    assert Counter(c.node for c in cold) == {"a": 3, "b": 3}
    assert {c.reason for c in cold} == {"affinity"}
    aiko = _prompt("aiko")
    warm = Router(policy="cache_aware", states=[_state("a", holds=[aiko]), _state("b")])
    assert [warm.route(aiko).node for _ in range(3)] == ["a"] * 3  # loads 0, 1, 2: within 4


def test_round_robin_takes_turns_from_the_first_turn():
    router = Router(policy="round_robin", states=[_state("a"), _state("b")], first_turn=3)
    assert [router.route(_prompt(f"r{i}")).node for i in range(4)] == ["b", "a", "b", "a"]


def test_fixed_is_the_position_rule_and_a_down_nodes_share_goes_to_a_live_one():
    states = [_state("a"), _state("b"), _state("c")]
    router = Router(policy="fixed", states=states)
    requests = [RouteRequest(prefixes=(), affinity_key="", position=i) for i in range(6)]
    assert [router.route(r).node for r in requests] == ["a", "b", "c", "a", "b", "c"]
    down_b = Router(policy="fixed", states=[_state("a"), _state("b", up=False), _state("c")])
    assert {down_b.route(r).node for r in requests} == {"a", "c"}


@pytest.mark.parametrize("policy", POLICIES)
def test_down_nodes_get_nothing_and_with_none_up_the_fixed_rule_holds(policy):
    states = [_state("a", up=False), _state("b")]
    router = Router(policy=policy, states=states)
    assert {router.route(_prompt(f"r{i}")).node for i in range(6)} == {"b"}
    none_up = Router(policy=policy, states=[_state("a", up=False), _state("b", up=False)])
    requests = [RouteRequest(prefixes=(), affinity_key="", position=i) for i in range(4)]
    choices = [none_up.route(r) for r in requests]
    assert [c.node for c in choices] == ["a", "b", "a", "b"]
    assert {c.reason for c in choices} == {"no_live_node"}


def test_a_bad_policy_is_refused_saying_which_exist():
    with pytest.raises(ValueError, match="cache_aware, round_robin, fixed"):
        Router(policy="random", states=[_state("a")])


def test_the_runs_routing_choices_are_the_policies():
    assert tuple(Run.Routing.values) == POLICIES


def test_heartbeats_make_node_states_silent_ones_down():
    now = 1000.0
    heartbeats = [
        NodeHeartbeat(node="a", worker="a@1", sent_at=now - 1, num_running=2, prefix_keys=("k1",)),
        NodeHeartbeat(node="a", worker="a@2", sent_at=now - 2, num_waiting=3, num_queued=5),
        NodeHeartbeat(node="b", worker="b@1", sent_at=now - 30, num_running=4, prefix_keys=("k2",)),
    ]
    a, b, c = node_states_from(["a", "b", "c"], heartbeats, now=now, down_s=10)
    assert a.is_up and a.load == 2 + 3 + 5 and a.prefix_keys == {"k1"}
    assert a.workers == ("a@1", "a@2") and a.last_seen_s == pytest.approx(1)
    assert not b.is_up and b.load == 0 and not b.prefix_keys and b.last_seen_s == pytest.approx(30)
    assert not c.is_up and c.last_seen_s is None


def test_served_prefixes_keep_the_most_recent_within_the_limit():
    served = ServedPrefixes(limit=3)
    requests = [_prompt(n) for n in ("aiko", "ben", "chie")]
    for request in requests:
        served.record(request.prefixes)
    assert served.changed.is_set()
    keys = served.keys()
    # Most recent first: chie's own head, the shared head (served again by chie), ben's head.
    assert keys == (
        requests[2].prefixes[1].key,
        requests[2].prefixes[0].key,
        requests[1].prefixes[1].key,
    )


def test_a_heartbeat_survives_its_json():
    heartbeat = NodeHeartbeat(
        node="a", worker="a@h", sent_at=5.0, num_running=1, kv_cache_usage=0.25, prefix_keys=("k",)
    )
    assert NodeHeartbeat.from_json(heartbeat.to_json()) == heartbeat


def test_manage_py_check_names_bad_routing_settings(settings):
    from inference.checks import routing_settings_problems

    assert routing_settings_problems() == []
    settings.INFERENCE_ROUTING_POLICY = "random"
    settings.INFERENCE_ROUTING_BALANCE_REL = 0.5
    settings.INFERENCE_HEARTBEAT_INTERVAL_S = 20.0
    problems = " | ".join(routing_settings_problems())
    assert "POKOMACHI_ROUTING='random': use one of cache_aware, round_robin, fixed" in problems
    assert "relative balance threshold must be ≥ 1" in problems
    assert "POKOMACHI_HEARTBEAT_INTERVAL must be more than 0 and less than" in problems


def _completion(name: str, salt: str = "run-1") -> CompletionRequest:
    messages = [SHARED, _own(name), {"role": "user", "content": f"{name}, what now?"}]
    return CompletionRequest(
        messages=messages, json_schema=None, max_tokens=8, cache_salt=salt, affinity_key=name
    )


def test_completion_route_matches_the_requests_prefixes_with_the_settings_thresholds(settings):
    """The door the town routes through (inference/services.py): it hashes each request's
    prefixes itself, and takes the balance thresholds from the settings."""
    states = [_state("a", load=10), _state("b", holds=[_prompt("aiko")])]
    requests = [_completion("aiko"), _completion("ben")]
    choices = completion_route(
        requests=requests, nodes=["a", "b"], policy="cache_aware", states=states
    )
    assert [(c.node, c.reason) for c in choices] == [("b", "balance"), ("b", "balance")]
    settings.INFERENCE_ROUTING_BALANCE_ABS = 100  # never imbalanced: the cache decides
    choices = completion_route(
        requests=requests, nodes=["a", "b"], policy="cache_aware", states=states
    )
    assert [(c.node, c.reason) for c in choices] == [("b", "cache"), ("b", "cache")]
    assert choices[0].num_matched_chars > choices[1].num_matched_chars  # own head vs shared


def test_a_replacement_node_only_for_a_request_whose_node_is_down():
    states = [_state("a", up=False), _state("b"), _state("c")]
    aiko = _completion("aiko")
    replace = dict(request=aiko, policy="fixed", states=states, position=0)
    assert completion_node_replacement(node="b", **replace) is None  # b is up
    assert completion_node_replacement(node="a", **replace) == "b"  # position 0 of b, c
    down = [_state("a", up=False), _state("b", up=False)]
    assert completion_node_replacement(node="a", **{**replace, "states": down}) is None
