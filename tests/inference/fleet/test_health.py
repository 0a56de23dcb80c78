"""Heartbeat stores (Redis and in-process: one interface) and the publisher a node worker runs
(inference/fleet/health.py). Workers publishing for real: tests/town/test_routing_nodes.py."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from inference.fleet.health import (
    HeartbeatPublisher,
    MemoryHeartbeatStore,
    NodeHeartbeat,
    RedisHeartbeatStore,
    heartbeat_store,
    node_states,
)
from inference.fleet.prefixes import ServedPrefixes, prompt_prefixes


@pytest.fixture(params=["redis", "memory"])
def store(request, redis_url):
    if request.param == "memory":
        return MemoryHeartbeatStore()
    return RedisHeartbeatStore(redis.Redis.from_url(redis_url), f"test-{uuid.uuid4().hex[:8]}")


def test_a_store_keeps_heartbeats_per_node_and_worker_until_removed_or_expired(store):
    now = time.time()
    store.put(NodeHeartbeat(node="a", worker="a@1", sent_at=now), keep_s=60)
    store.put(NodeHeartbeat(node="a", worker="a@1", sent_at=now + 1), keep_s=60)  # replaces
    store.put(NodeHeartbeat(node="a", worker="a@2", sent_at=now), keep_s=60)
    store.put(NodeHeartbeat(node="ab", worker="ab@1", sent_at=now), keep_s=60)
    store.put(NodeHeartbeat(node="b", worker="b@1", sent_at=now), keep_s=1)
    read = sorted((hb.node, hb.worker, hb.sent_at) for hb in store.read(["a", "b"]))
    assert read == [("a", "a@1", now + 1), ("a", "a@2", now), ("b", "b@1", now)]
    store.remove(node="a", worker="a@2")
    time.sleep(1.6)  # b@1 was kept 1 s
    assert [(hb.node, hb.worker) for hb in store.read(["a", "b"])] == [("a", "a@1")]


def test_turns_are_one_counter_shared_by_its_users(store):
    first = store.turn("round_robin", by=3)
    assert store.turn("round_robin") == first + 1
    assert store.turn("other") == 1


def test_a_publisher_says_its_nodes_are_up_and_holding_what_it_served(redis_url, settings):
    settings.INFERENCE_HEARTBEAT_INTERVAL_S = 0.2
    store = RedisHeartbeatStore(redis.Redis.from_url(redis_url), f"test-{uuid.uuid4().hex[:8]}")
    served = ServedPrefixes(limit=10)
    node = f"test-{uuid.uuid4().hex[:8]}"
    publisher = HeartbeatPublisher(nodes=[node], worker=f"{node}@h", store=store, served=served)
    publisher.start()
    try:
        (state,) = node_states([node], store)
        assert state.is_up and state.workers == (f"{node}@h",) and not state.prefix_keys
        prefixes = prompt_prefixes([{"role": "system", "content": "x", "cache": True}], "s")
        served.record(prefixes)
        deadline = time.monotonic() + 5
        while not node_states([node], store)[0].prefix_keys:
            assert time.monotonic() < deadline, "the served prefix never reached the heartbeat"
            time.sleep(0.02)
        assert node_states([node], store)[0].prefix_keys == {prefixes[0].key}
    finally:
        publisher.stop()
    # Stopping says the node is down at once.
    assert not node_states([node], store)[0].is_up


def test_a_node_silent_past_the_down_time_is_down(settings):
    settings.INFERENCE_NODE_DOWN_S = 5
    store = MemoryHeartbeatStore()
    store.put(NodeHeartbeat(node="a", worker="a@1", sent_at=time.time() - 6), keep_s=60)
    store.put(NodeHeartbeat(node="b", worker="b@1", sent_at=time.time() - 1), keep_s=60)
    a, b = node_states(["a", "b"], store)
    assert not a.is_up and a.last_seen_s >= 6
    assert b.is_up


@pytest.fixture
def nodes_heard(settings, redis_url):
    """Two configured nodes: `up` heard a second ago, `down` 60 s ago; their heartbeats in
    Redis under a fresh prefix."""
    settings.INFERENCE_METRICS_PREFIX = f"test-{uuid.uuid4().hex[:8]}"
    settings.INFERENCE_NODE_DOWN_S = 10
    up, down = f"up-{uuid.uuid4().hex[:6]}", f"down-{uuid.uuid4().hex[:6]}"
    settings.INFERENCE_NODES = [up, down]
    store = heartbeat_store()
    store.put(
        NodeHeartbeat(node=up, worker=f"{up}@h", sent_at=time.time() - 1, num_running=3,
                      num_queued=2, prefix_keys=("k1", "k2")),
        keep_s=60,
    )  # fmt: skip
    store.put(NodeHeartbeat(node=down, worker=f"{down}@h", sent_at=time.time() - 60), keep_s=60)
    return up, down


def test_metrics_show_each_nodes_state(client, nodes_heard):
    up, down = nodes_heard
    text = client.get("/metrics").content.decode()
    assert f'pokomachi:node_up{{node="{up}"}} 1.0' in text
    assert f'pokomachi:node_up{{node="{down}"}} 0.0' in text
    assert f'pokomachi:node_load{{node="{up}"}} 5.0' in text
    assert f'pokomachi:node_prefixes{{node="{up}"}} 2.0' in text
    assert f'pokomachi:node_heartbeat_age_seconds{{node="{down}"}} 6' in text  # 60.x s


def test_the_admin_node_page_shows_up_and_down(admin_client, nodes_heard):
    up, down = nodes_heard
    page = admin_client.get("/admin/nodes/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f'<td data-label="node">{up}</td>' in html
    assert f'<td data-label="node">{down}</td>' in html
    assert html.count("pk-node-up") == 1 and html.count("pk-node-down") == 1
    assert f"{up}@h" in html and "s ago" in html


def test_the_node_page_is_for_staff_only(client):
    page = client.get("/admin/nodes/")
    assert page.status_code == 302 and "/admin/login/" in page["Location"]
