"""Live engine gauges for /metrics: each worker publishes its engine's stats to Redis, and the web
process, which holds no engine, reads the latest snapshot of every worker at scrape time.

A worker (inference/fleet/worker.py starts `StatsPublisher` when it is ready) writes
`engine.stats()` every settings.INFERENCE_STATS_INTERVAL_S to the hash
`<INFERENCE_METRICS_PREFIX>:engine:<worker hostname>`, with a time to live of a few intervals:
a worker that died drops out of the gauges on its own. `EngineStatsCollector` turns the
snapshots into vLLM's gauges, one series per worker (label `engine`) and model.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator
from typing import Any

import redis
from django.conf import settings
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from inference.completions.runtime import engine_get, engine_is_loaded, engine_settings
from inference.engine.metrics import EngineStats

logger = logging.getLogger(__name__)

TTL_INTERVALS = 3
# EngineStats field → (vLLM's gauge name, help). vLLM ≥ 0.9 names KV usage kv_cache_usage_perc
# (formerly gpu_cache_usage_perc).
GAUGES = {
    "num_running": ("vllm:num_requests_running", "Number of requests in model execution batches."),
    "num_waiting": ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
    "kv_cache_usage": (
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
    ),
}
# Engine-lifetime counts, per worker (they restart at 0 with the worker, as Prometheus allows).
COUNTERS = {
    "num_steps": ("pokomachi:engine_steps", "Engine steps (schedule, run, postprocess) taken."),
}
# Where the engine's lost-token counters go once EngineStats has them: every `num_lost_to_<why>`
# field becomes pokomachi:engine_lost_prompt_tokens_total{reason="<why>"} (none exist yet on this
# branch; the per-request ones are pokomachi:lost_prompt_tokens_total in
# inference/completions/metrics.py).
LOST_PREFIX = "num_lost_to_"
# The KV tiers below the device pool (EngineStats.kv_tiers): each tier's counters are flattened
# into the snapshot as `kv_tier:<tier>:<field>` and exposed one family per field, label `tier`.
TIER_PREFIX = "kv_tier:"
TIER_COUNTERS = {
    "num_hits": ("pokomachi:kv_tier_hits", "Blocks found in a KV tier."),
    "num_misses": ("pokomachi:kv_tier_misses", "Blocks looked up in a KV tier and not found."),
    "bytes_read": ("pokomachi:kv_tier_read_bytes", "Bytes read from a KV tier."),
    "bytes_written": ("pokomachi:kv_tier_written_bytes", "Bytes written to a KV tier."),
    "load_s": ("pokomachi:kv_tier_load_seconds", "Time spent reading blocks from a KV tier."),
    "num_evictions": (
        "pokomachi:kv_tier_evictions", "Blocks a KV tier evicted for room (its byte budget)."),
    "num_expired": ("pokomachi:kv_tier_expired", "Blocks the disk tier deleted past their TTL."),
    "num_invalid": (
        "pokomachi:kv_tier_invalid",
        "Block files refused and deleted: links, special files, damaged, forged, foreign, "
        "non-finite or old-version."),
    "num_read_failures": (
        "pokomachi:kv_tier_read_failures",
        "Disk tier reads that failed or did not come back in time (the request recomputed)."),
}  # fmt: skip
TIER_GAUGES = {
    "num_blocks": ("pokomachi:kv_tier_blocks", "Blocks a KV tier holds."),
    "bytes_used": ("pokomachi:kv_tier_used_bytes", "Bytes a KV tier holds."),
    "writes_disabled": (
        "pokomachi:kv_tier_writes_disabled", "1 when the disk tier's directory cannot be written."),
    "reads_disabled": (
        "pokomachi:kv_tier_reads_disabled", "1 when the disk tier kept failing and is off."),
}  # fmt: skip
LOST = ("pokomachi:engine_lost_prompt_tokens", "Prompt tokens the engine could not reuse, by why.")


def _key_prefix() -> str:
    return f"{settings.INFERENCE_METRICS_PREFIX}:engine:"


def engine_stats_snapshot() -> dict[str, float]:
    """This process's engine stats as flat numbers (the engine must be loaded)."""
    return stats_snapshot(engine_get().stats())


def stats_snapshot(stats: EngineStats) -> dict[str, float]:
    """EngineStats as flat numbers: its numeric fields, and each KV tier's as
    `kv_tier:<tier>:<field>`."""
    fields = {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}
    for tier, tier_stats in stats.kv_tiers.items():
        for f in dataclasses.fields(tier_stats):
            fields[f"{TIER_PREFIX}{tier}:{f.name}"] = getattr(tier_stats, f.name)
    return {k: float(v) for k, v in fields.items() if isinstance(v, int | float)}


def engine_stats_publish(client: redis.Redis, *, engine_name: str) -> None:
    snapshot = {**engine_stats_snapshot(), "model_name": engine_settings()["model"]}
    key = _key_prefix() + engine_name
    ttl_s = max(1, round(settings.INFERENCE_STATS_INTERVAL_S * TTL_INTERVALS))
    pipe = client.pipeline(transaction=True)
    pipe.delete(key)
    pipe.hset(key, mapping=snapshot)
    pipe.expire(key, ttl_s)
    pipe.execute()


class StatsPublisher:
    """A daemon thread publishing this process's engine stats until `stop`."""

    def __init__(self, engine_name: str) -> None:
        self.engine_name = engine_name
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-stats", daemon=True)

    def start(self) -> StatsPublisher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        try:
            with redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1.0) as client:
                client.delete(_key_prefix() + self.engine_name)
        except redis.RedisError:
            pass  # it expires by itself

    def _run(self) -> None:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1.0)
        warned = False
        while not self._stopped.wait(settings.INFERENCE_STATS_INTERVAL_S):
            if not engine_is_loaded():
                continue
            try:
                engine_stats_publish(client, engine_name=self.engine_name)
                warned = False
            except redis.RedisError as exc:
                if not warned:  # once per outage, not every interval
                    logger.warning("engine stats not published (Redis: %s)", exc)
                warned = True
        client.close()


def engine_stats_read(client: redis.Redis) -> dict[str, dict[str, str]]:
    """{worker name: its latest snapshot} for every worker that published recently."""
    prefix = _key_prefix()
    snapshots = {}
    for key in client.scan_iter(match=prefix + "*", count=100):
        values = client.hgetall(key)
        if values:
            snapshots[key.decode().removeprefix(prefix)] = {
                k.decode(): v.decode() for k, v in values.items()
            }
    return snapshots


class EngineStatsCollector:
    """vLLM's live gauges from the workers' snapshots, at scrape time."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def collect(self) -> Iterator[Any]:
        try:
            snapshots = engine_stats_read(self._client)
        except redis.RedisError as exc:
            logger.warning("engine stats not readable (Redis at %s: %s)", settings.REDIS_URL, exc)
            return
        labels = ["engine", "model_name"]
        gauges = {f: GaugeMetricFamily(n, h, labels=labels) for f, (n, h) in GAUGES.items()}
        counters = {f: CounterMetricFamily(n, h, labels=labels) for f, (n, h) in COUNTERS.items()}
        lost = CounterMetricFamily(*LOST, labels=[*labels, "reason"])
        tier_labels = [*labels, "tier"]
        tiers = {
            **{
                f: CounterMetricFamily(n, h, labels=tier_labels)
                for f, (n, h) in TIER_COUNTERS.items()
            },
            **{f: GaugeMetricFamily(n, h, labels=tier_labels) for f, (n, h) in TIER_GAUGES.items()},
        }
        for engine_name, snapshot in sorted(snapshots.items()):
            values = [engine_name, snapshot.get("model_name", "")]
            for name, family in [*gauges.items(), *counters.items()]:
                if name in snapshot:
                    family.add_metric(values, float(snapshot[name]))
            for name, value in snapshot.items():
                if name.startswith(LOST_PREFIX):
                    lost.add_metric([*values, name.removeprefix(LOST_PREFIX)], float(value))
                if name.startswith(TIER_PREFIX):
                    tier, _, field = name.removeprefix(TIER_PREFIX).partition(":")
                    if field in tiers:
                        tiers[field].add_metric([*values, tier], float(value))
        yield from gauges.values()
        yield from counters.values()
        yield lost
        yield from tiers.values()
