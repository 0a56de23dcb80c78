"""Prometheus metrics with vLLM's names, summed across every process that runs an engine.

Engines run in node workers (and `run_town --inline`), not in the web process that answers
`GET /metrics`, and workers may sit on other machines. So each completion is recorded where it
ran — `completion_generate` calls `metrics_record` with the engine's per-request metrics — into
one Redis hash (settings.REDIS_URL, key `<INFERENCE_METRICS_PREFIX>:series`, HINCRBYFLOAT: atomic,
so workers never lose each other's counts), and `/metrics` reads that hash and renders it with
`prometheus-client`. Counters and histograms therefore cover every node since the hash was
made, exactly as Prometheus expects of counters. The live gauges (running, waiting, KV usage)
come from each worker's latest stats snapshot (inference/completions/engine_stats.py), and each
node's state (up, load, heartbeat age, prefixes held) from its heartbeats
(inference/fleet/health.py). Recording is best effort: if Redis does not answer, the completion goes
on, the loss is logged, and recording pauses for a while.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from inference.completions.types import CompletionMetrics

logger = logging.getLogger(__name__)

# vLLM's buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip
TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000]

# name → (help, buckets, value from the request's CompletionMetrics)
HISTOGRAMS: dict[str, tuple[str, list[float], Any]] = {
    "vllm:time_to_first_token_seconds": (
        "Histogram of time to first token in seconds.", TTFT_BUCKETS, lambda m: m.ttft_s),
    "vllm:e2e_request_latency_seconds": (
        "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS, lambda m: m.e2e_s),
    "vllm:request_queue_time_seconds": (
        "Histogram of time spent in WAITING phase for request.", LATENCY_BUCKETS,
        lambda m: m.queue_s),
    "vllm:request_prefill_time_seconds": (
        "Histogram of time spent in PREFILL phase for request.", LATENCY_BUCKETS,
        lambda m: m.prefill_s),
    "vllm:request_decode_time_seconds": (
        "Histogram of time spent in DECODE phase for request.", LATENCY_BUCKETS,
        lambda m: m.decode_s),
    "vllm:request_inference_time_seconds": (
        "Histogram of time spent in RUNNING phase for request.", LATENCY_BUCKETS,
        lambda m: m.prefill_s + m.decode_s),
    # Before arrival, so not in queue or e2e: the compile of the request's JSON schema.
    "pokomachi:request_grammar_compile_seconds": (
        "Histogram of time spent compiling the request's JSON schema (0 from the cache).",
        LATENCY_BUCKETS, lambda m: m.grammar_compile_s),
    "vllm:request_prompt_tokens": (
        "Number of prefill tokens processed.", TOKEN_BUCKETS, lambda m: m.num_prompt_tokens),
    "vllm:request_generation_tokens": (
        "Number of generation tokens processed.", TOKEN_BUCKETS,
        lambda m: m.num_output_tokens),
}  # fmt: skip
COUNTERS: dict[str, tuple[str, Any]] = {
    "vllm:prompt_tokens": ("Number of prefill tokens processed.", lambda m: m.num_prompt_tokens),
    "vllm:generation_tokens": (
        "Number of generation tokens processed.", lambda m: m.num_output_tokens),
    "vllm:prefix_cache_queries": (
        "Prefix cache queries, in terms of number of queried tokens.",
        lambda m: m.num_prompt_tokens),
    "vllm:prefix_cache_hits": (
        "Prefix cache hits, in terms of number of cached tokens.",
        lambda m: m.num_cached_tokens),
    "vllm:num_preemptions": (
        "Cumulative number of preemption from the engine.", lambda m: m.num_preemptions),
    # Of the prefix-cache hits, the tokens loaded from the KV tiers below the device pool.
    "pokomachi:prefix_cache_hits_host": (
        "Prefix cache hits loaded from the host-memory KV tier, in tokens.",
        lambda m: m.num_cached_tokens_host),
    "pokomachi:prefix_cache_hits_disk": (
        "Prefix cache hits loaded from the disk KV tier, in tokens.",
        lambda m: m.num_cached_tokens_disk),
    "pokomachi:kv_load_seconds": (
        "Time requests waited for their blocks from the KV tiers, in seconds.",
        lambda m: m.kv_load_s),
}  # fmt: skip
SUCCESS = "vllm:request_success"
LOST = "pokomachi:lost_prompt_tokens"
HELP = {
    SUCCESS: "Count of successfully processed requests.",
    LOST: "Prompt tokens that were not reused from the prefix cache, by reason.",
}
PAUSE_AFTER_FAILURE_S = 30.0


def _field(name: str, labels: dict[str, str], part: str) -> str:
    return f"{name}\t{json.dumps(labels, sort_keys=True)}\t{part}"


def _bucket_index(value: float, buckets: list[float]) -> int:
    return next((i for i, bound in enumerate(buckets) if value <= bound), len(buckets))


def metric_increments(
    *, model: str, metrics: CompletionMetrics, finish_reason: str
) -> dict[str, float]:
    """The hash fields one finished request adds to, and by how much."""
    labels = {"model_name": model}
    out: dict[str, float] = {}
    for name, (_, value_of) in COUNTERS.items():
        out[_field(name, labels, "total")] = float(value_of(metrics) or 0)
    out[_field(SUCCESS, {**labels, "finished_reason": finish_reason}, "total")] = 1.0
    for reason, tokens in metrics.lost_tokens.items():
        out[_field(LOST, {**labels, "reason": reason}, "total")] = float(tokens)
    for name, (_, buckets, value_of) in HISTOGRAMS.items():
        try:
            value = float(value_of(metrics))
        except TypeError:  # a time the backend did not report (None)
            continue
        out[_field(name, labels, f"b{_bucket_index(value, buckets)}")] = 1.0
        out[_field(name, labels, "sum")] = value
        out[_field(name, labels, "count")] = 1.0
    return out


class _Store:
    """The Redis hash; one client per URL, and a pause after a failed write."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[str, redis.Redis] = {}
        self._paused_until = 0.0

    def client(self) -> redis.Redis:
        url = settings.REDIS_URL
        with self._lock:
            if url not in self._clients:
                self._clients[url] = redis.Redis.from_url(
                    url, socket_timeout=1.0, socket_connect_timeout=0.5
                )
            return self._clients[url]

    @staticmethod
    def key() -> str:
        return f"{settings.INFERENCE_METRICS_PREFIX}:series"

    def add(self, increments: dict[str, float]) -> None:
        if time.monotonic() < self._paused_until:
            return
        try:
            pipe = self.client().pipeline(transaction=True)
            for field, amount in increments.items():
                pipe.hincrbyfloat(self.key(), field, amount)
            pipe.execute()
        except redis.RedisError as exc:
            self._paused_until = time.monotonic() + PAUSE_AFTER_FAILURE_S
            logger.warning(
                "metrics not recorded (Redis at %s: %s); pausing recording for %s s",
                settings.REDIS_URL,
                exc,
                PAUSE_AFTER_FAILURE_S,
            )

    def read(self) -> dict[str, float] | None:
        try:
            raw = self.client().hgetall(self.key())
        except redis.RedisError as exc:
            logger.warning("metrics not readable (Redis at %s: %s)", settings.REDIS_URL, exc)
            return None
        return {k.decode(): float(v) for k, v in raw.items()}


_store = _Store()


def metrics_record(*, model: str, metrics: CompletionMetrics, finish_reason: str) -> None:
    """Add one finished request to the shared counters."""
    _store.add(metric_increments(model=model, metrics=metrics, finish_reason=finish_reason))


class RedisCollector:
    """Turns the hash back into Prometheus metric families at scrape time."""

    def collect(self) -> Iterator[Any]:
        values = _store.read()
        up = GaugeMetricFamily(
            "pokomachi:metrics_store_up", "1 if the Redis metrics store answered this scrape."
        )
        up.add_metric([], 0.0 if values is None else 1.0)
        yield up
        series: dict[tuple[str, str], dict[str, float]] = {}
        for field, value in (values or {}).items():
            name, labels, part = field.split("\t")
            series.setdefault((name, labels), {})[part] = value
        yield from self._counters(series)
        yield from self._histograms(series)

    @staticmethod
    def _counters(series: dict[tuple[str, str], dict[str, float]]) -> Iterator[Any]:
        helps = {**{n: h for n, (h, _) in COUNTERS.items()}, **HELP}
        for name, help_ in helps.items():
            rows = [(json.loads(lb), parts) for (n, lb), parts in series.items() if n == name]
            if not rows:
                continue
            label_names = sorted(rows[0][0])
            family = CounterMetricFamily(name, help_, labels=label_names)
            for labels, parts in rows:
                family.add_metric([labels[k] for k in label_names], parts.get("total", 0.0))
            yield family

    @staticmethod
    def _histograms(series: dict[tuple[str, str], dict[str, float]]) -> Iterator[Any]:
        for name, (help_, buckets, _) in HISTOGRAMS.items():
            rows = [(json.loads(lb), parts) for (n, lb), parts in series.items() if n == name]
            if not rows:
                continue
            label_names = sorted(rows[0][0])
            family = HistogramMetricFamily(name, help_, labels=label_names)
            for labels, parts in rows:
                cumulative, running = [], 0.0
                for i, bound in enumerate([*buckets, float("inf")]):
                    running += parts.get(f"b{i}", 0.0)
                    cumulative.append(("+Inf" if bound == float("inf") else str(bound), running))
                family.add_metric(
                    [labels[k] for k in label_names], cumulative, sum_value=parts.get("sum", 0.0)
                )
            yield family


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """GET: the exposition; HEAD: the same status and headers, no body (uptime checks)."""
    from inference.completions.engine_stats import EngineStatsCollector
    from inference.fleet.health import NodeHealthCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(RedisCollector())
    registry.register(EngineStatsCollector(_store.client()))
    registry.register(NodeHealthCollector())
    body = generate_latest(registry)
    response = HttpResponse(b"" if request.method == "HEAD" else body)
    response["Content-Type"] = CONTENT_TYPE_LATEST
    response["Content-Length"] = str(len(body))
    return response
