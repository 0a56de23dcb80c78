"""Node health: every node worker publishes a heartbeat (its engine's live load and the prompt
prefixes it served lately); a node whose workers have all been silent for
settings.INFERENCE_NODE_DOWN_S is down. Routing (inference/fleet/router.py), the tick loop's
failover, the admin's node list and /metrics read the same NodeStates.

A worker (inference/fleet/worker.py starts `HeartbeatPublisher` when it is ready) writes one
NodeHeartbeat per node it consumes every settings.INFERENCE_HEARTBEAT_INTERVAL_S, and at once
after it served a prompt (so the next tick sees where the prefixes went). The heartbeats live in
a HeartbeatStore: Redis (the broker's, so every machine sees them; the embedded default runs an
embedded Redis too) or, for a single process, memory. A heartbeat is kept
settings.INFERENCE_HEARTBEAT_KEEP_S, so a down node is shown as "down, last seen N s ago" for a
while before it is forgotten. Ages are measured on the reader's clock against the sender's
(machines keep time with NTP; a skew of seconds shifts when a node counts as down).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis
from django.conf import settings
from prometheus_client.core import GaugeMetricFamily

from inference.fleet.prefixes import ServedPrefixes, served_prefixes

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeHeartbeat:
    """One worker's report on one node: alive at `sent_at` (Unix time), this loaded."""

    node: str
    worker: str  # the Celery worker's hostname, e.g. spark-a@gpu1
    sent_at: float
    num_running: int = 0  # requests in the engine's running batch
    num_waiting: int = 0  # requests in the engine's waiting queue
    num_queued: int = 0  # messages on the node's Celery queue that no worker took yet
    num_reserved: int = 0  # tasks this worker took off the queue (prefetched), not begun yet
    kv_cache_usage: float = 0.0  # share of KV blocks used by live requests, 0..1
    # Served lately, most recent first (inference/fleet/prefixes.py).
    prefix_keys: tuple[str, ...] = ()
    model: str = ""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeHeartbeat:
        fields = json.loads(text)
        fields["prefix_keys"] = tuple(fields.get("prefix_keys", ()))
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in fields.items() if k in known})


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node as routing sees it: up or down, its load and the prefixes it holds, summed over
    its live workers."""

    node: str
    is_up: bool
    num_running: int = 0
    num_waiting: int = 0
    num_queued: int = 0
    num_reserved: int = 0
    kv_cache_usage: float = 0.0
    prefix_keys: frozenset[str] = frozenset()
    workers: tuple[str, ...] = ()  # the live ones
    last_seen_s: float | None = None  # since the newest heartbeat of any worker; None: never
    # Workers of it heard before but silent for down_s now, each with its last heartbeat's Unix
    # time: one that went silent after a message was sent may have taken it with it.
    silent_workers: tuple[tuple[str, float], ...] = ()

    @property
    def load(self) -> int:
        """What a new request would wait behind: running, waiting, taken by a worker but not
        begun, and still on the queue."""
        return self.num_running + self.num_waiting + self.num_reserved + self.num_queued


class HeartbeatStore(Protocol):
    """Where heartbeats are kept. `turn` is a shared counter (round-robin routing's)."""

    def put(self, heartbeat: NodeHeartbeat, *, keep_s: float) -> None: ...

    def remove(self, *, node: str, worker: str) -> None: ...

    def read(self, nodes: Sequence[str]) -> list[NodeHeartbeat]: ...

    def turn(self, name: str, *, by: int = 1) -> int: ...


class RedisHeartbeatStore:
    """Heartbeats as Redis keys `<prefix>:heartbeat:<node>:<worker>` (JSON), each expiring."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._client = client
        self._prefix = prefix

    def _key(self, node: str, worker: str) -> str:
        return f"{self._prefix}:heartbeat:{node}:{worker}"

    def put(self, heartbeat: NodeHeartbeat, *, keep_s: float) -> None:
        key = self._key(heartbeat.node, heartbeat.worker)
        self._client.set(key, heartbeat.to_json(), ex=max(1, round(keep_s)))

    def remove(self, *, node: str, worker: str) -> None:
        self._client.delete(self._key(node, worker))

    def read(self, nodes: Sequence[str]) -> list[NodeHeartbeat]:
        keys = [
            key
            for node in nodes
            for key in self._client.scan_iter(match=self._key(node, "*"), count=200)
        ]
        values = self._client.mget(keys) if keys else []
        return [NodeHeartbeat.from_json(v) for v in values if v is not None]

    def turn(self, name: str, *, by: int = 1) -> int:
        return int(self._client.incrby(f"{self._prefix}:turn:{name}", by))


class MemoryHeartbeatStore:
    """Heartbeats in this process only: for a town and its workers in one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heartbeats: dict[tuple[str, str], tuple[NodeHeartbeat, float]] = {}
        self._turns: dict[str, int] = {}

    def put(self, heartbeat: NodeHeartbeat, *, keep_s: float) -> None:
        with self._lock:
            key = (heartbeat.node, heartbeat.worker)
            self._heartbeats[key] = (heartbeat, time.monotonic() + keep_s)

    def remove(self, *, node: str, worker: str) -> None:
        with self._lock:
            self._heartbeats.pop((node, worker), None)

    def read(self, nodes: Sequence[str]) -> list[NodeHeartbeat]:
        now = time.monotonic()
        with self._lock:
            for key in [k for k, (_, until) in self._heartbeats.items() if until <= now]:
                del self._heartbeats[key]
            return [hb for (node, _), (hb, _) in self._heartbeats.items() if node in set(nodes)]

    def turn(self, name: str, *, by: int = 1) -> int:
        with self._lock:
            self._turns[name] = self._turns.get(name, 0) + by
            return self._turns[name]


@functools.cache
def _store_for(kind: str, url: str, prefix: str) -> HeartbeatStore:
    if kind == "memory":
        return MemoryHeartbeatStore()
    client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
    return RedisHeartbeatStore(client, prefix)


def heartbeat_store() -> HeartbeatStore:
    """The store settings.INFERENCE_HEARTBEAT_STORE names: "redis" (settings.REDIS_URL, the
    default) or "memory" (this process only)."""
    kind = settings.INFERENCE_HEARTBEAT_STORE
    if kind not in ("redis", "memory"):
        raise ValueError(
            f"INFERENCE_HEARTBEAT_STORE must be 'redis' or 'memory', got {kind!r} "
            "(env POKOMACHI_HEARTBEAT_STORE)"
        )
    return _store_for(kind, settings.REDIS_URL, settings.INFERENCE_METRICS_PREFIX)


def node_states_from(
    nodes: Sequence[str], heartbeats: Sequence[NodeHeartbeat], *, now: float, down_s: float
) -> list[NodeState]:
    """Each of `nodes` (in order) from these heartbeats: up if a worker of it was heard within
    `down_s` of `now`; a down node has no load and holds nothing."""
    states = []
    for node in nodes:
        own = [hb for hb in heartbeats if hb.node == node]
        live = [hb for hb in own if now - hb.sent_at <= down_s]
        newest = max((hb.sent_at for hb in own), default=None)
        states.append(
            NodeState(
                node=node,
                is_up=bool(live),
                num_running=sum(hb.num_running for hb in live),
                num_waiting=sum(hb.num_waiting for hb in live),
                # Every worker of a node sees the same queue: count it once.
                num_queued=max((hb.num_queued for hb in live), default=0),
                num_reserved=sum(hb.num_reserved for hb in live),
                kv_cache_usage=max((hb.kv_cache_usage for hb in live), default=0.0),
                prefix_keys=frozenset(k for hb in live for k in hb.prefix_keys),
                workers=tuple(sorted(hb.worker for hb in live)),
                last_seen_s=None if newest is None else max(0.0, now - newest),
                silent_workers=tuple(
                    sorted((hb.worker, hb.sent_at) for hb in own if now - hb.sent_at > down_s)
                ),
            )
        )
    return states


def node_states(nodes: Sequence[str], store: HeartbeatStore | None = None) -> list[NodeState]:
    """The states of `nodes` now. With the store unreachable every node counts as down (the
    caller then keeps its fixed placement: nothing is rerouted on no evidence)."""
    store = store or heartbeat_store()
    try:
        heartbeats = store.read(nodes)
    except redis.RedisError as exc:
        logger.warning("node heartbeats not readable (%s); every node counts as down", exc)
        heartbeats = []
    return node_states_from(
        nodes, heartbeats, now=time.time(), down_s=settings.INFERENCE_NODE_DOWN_S
    )


class NodeHealthCollector:
    """/metrics: each configured node's state, from the heartbeats, at scrape time."""

    def collect(self) -> Iterator[Any]:
        from inference.fleet.nodes import node_names

        labels = ["node"]
        families = {
            "up": GaugeMetricFamily(
                "pokomachi:node_up",
                "1 if a worker of the node sent a heartbeat lately.",
                labels=labels,
            ),
            "load": GaugeMetricFamily(
                "pokomachi:node_load",
                "Requests running, waiting, taken but not begun, and queued on the node.",
                labels=labels,
            ),
            "age": GaugeMetricFamily(
                "pokomachi:node_heartbeat_age_seconds",
                "Seconds since the node's newest heartbeat (absent: never heard).",
                labels=labels,
            ),
            "prefixes": GaugeMetricFamily(
                "pokomachi:node_prefixes",
                "Prompt prefixes the node served lately (what routing matches on).",
                labels=labels,
            ),
        }
        for state in node_states(node_names()):
            families["up"].add_metric([state.node], 1.0 if state.is_up else 0.0)
            families["load"].add_metric([state.node], float(state.load))
            families["prefixes"].add_metric([state.node], float(len(state.prefix_keys)))
            if state.last_seen_s is not None:
                families["age"].add_metric([state.node], state.last_seen_s)
        yield from families.values()


def _queue_length(client: redis.Redis, queue: str) -> int:
    """Messages waiting on a node's Celery queue (kombu's Redis transport keeps a list per
    queue, named after it)."""
    return int(client.llen(queue))


def _reserved_not_begun() -> int:
    """Tasks this worker process has taken off its queues (each thread takes one ahead: the
    prefetch) but not begun; 0 outside a worker."""
    from celery.worker import state

    return max(0, len(state.reserved_requests) - len(state.active_requests))


class HeartbeatPublisher:
    """A daemon thread publishing this worker's heartbeat for each of its nodes until `stop`:
    every interval, and soon after each prompt it served."""

    MIN_GAP_S = 0.05  # between two heartbeats sent because prompts were served

    def __init__(
        self,
        *,
        nodes: Sequence[str],
        worker: str,
        store: HeartbeatStore | None = None,
        served: ServedPrefixes | None = None,
    ) -> None:
        self.nodes = list(nodes)
        self.worker = worker
        self._store = store or heartbeat_store()
        self._served = served or served_prefixes()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-heartbeat", daemon=True)
        self._broker: redis.Redis | None = None
        if settings.CELERY_BROKER_URL.startswith(("redis://", "rediss://", "unix://")):
            self._broker = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=1.0)

    def start(self) -> HeartbeatPublisher:
        self.publish()  # up at once, not one interval after ready
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop publishing and say so: the node is down now, not after INFERENCE_NODE_DOWN_S."""
        self._stopped.set()
        self._served.changed.set()
        self._thread.join(timeout=5)
        for node in self.nodes:
            with contextlib.suppress(redis.RedisError):  # else it ages out by itself
                self._store.remove(node=node, worker=self.worker)

    def heartbeats(self) -> list[NodeHeartbeat]:
        """What this worker reports now, one heartbeat per node."""
        from inference.completions.runtime import engine_get, engine_is_loaded, engine_settings

        stats = engine_get().stats() if engine_is_loaded() else None
        keys = self._served.keys()
        model = engine_settings().get("model", "")
        now = time.time()
        return [
            NodeHeartbeat(
                node=node,
                worker=self.worker,
                sent_at=now,
                num_running=stats.num_running if stats else 0,
                num_waiting=stats.num_waiting if stats else 0,
                num_queued=self._queued(node),
                num_reserved=_reserved_not_begun(),
                kv_cache_usage=float(stats.kv_cache_usage) if stats else 0.0,
                prefix_keys=keys,
                model=model,
            )
            for node in self.nodes
        ]

    def _queued(self, node: str) -> int:
        if self._broker is None:
            return 0
        try:
            return _queue_length(self._broker, node)
        except redis.RedisError:
            return 0

    def publish(self) -> None:
        keep_s = settings.INFERENCE_HEARTBEAT_KEEP_S
        for heartbeat in self.heartbeats():
            self._store.put(heartbeat, keep_s=keep_s)

    def _run(self) -> None:
        warned = False
        while not self._stopped.is_set():
            served = self._served.changed.wait(settings.INFERENCE_HEARTBEAT_INTERVAL_S)
            if self._stopped.is_set():
                return
            if served:
                self._served.changed.clear()
            try:
                self.publish()
                warned = False
            except redis.RedisError as exc:
                if not warned:  # once per outage
                    logger.warning("node heartbeat not published (Redis: %s)", exc)
                warned = True
            if served:
                self._stopped.wait(self.MIN_GAP_S)
