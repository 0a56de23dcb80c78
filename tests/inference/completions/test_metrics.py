"""GET /metrics: vLLM's metric names, summed in Redis from whichever process ran the engine —
recorded directly, through a real worker's completions, and with Redis down."""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from inference.completions.metrics import metrics_record
from inference.completions.types import CompletionMetrics

MODEL = "smollm2-tiny-random"


@pytest.fixture
def metrics_prefix(settings, redis_url):
    prefix = f"test-metrics-{uuid.uuid4().hex[:10]}"
    settings.INFERENCE_METRICS_PREFIX = prefix
    yield prefix
    client = redis.Redis.from_url(redis_url)
    client.delete(f"{prefix}:series", *client.keys(f"{prefix}:engine:*"))


def _scrape() -> dict[str, dict[tuple, float]]:
    """{sample name: {labels as sorted tuples: value}} from GET /metrics."""
    response = Client().get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[key] = sample.value
    return samples


def _request(**overrides) -> CompletionMetrics:
    fields = {
        "queue_s": 0.2,
        "prefill_s": 0.7,
        "decode_s": 1.2,
        "ttft_s": 0.9,
        "e2e_s": 2.1,
        "num_prompt_tokens": 1200,
        "num_cached_tokens": 1024,
        "num_output_tokens": 40,
        "num_preemptions": 0,
    }
    return CompletionMetrics(**{**fields, **overrides})


def test_recorded_requests_are_served_with_vllm_names(metrics_prefix):
    metrics_record(model=MODEL, metrics=_request(), finish_reason="stop")
    metrics_record(
        model=MODEL,
        # Lost tokens become a counter per reason, whatever the reasons are.
        metrics=_request(e2e_s=12.0, num_cached_tokens=0, lost_tokens={"eviction": 48, "cold": 16}),
        finish_reason="length",
    )
    s = _scrape()
    model = (("model_name", MODEL),)
    assert s["pokomachi:metrics_store_up"][()] == 1.0
    assert s["vllm:prefix_cache_queries_total"][model] == 2400
    assert s["vllm:prefix_cache_hits_total"][model] == 1024
    assert s["vllm:prompt_tokens_total"][model] == 2400
    assert s["vllm:generation_tokens_total"][model] == 80
    success = s["vllm:request_success_total"]
    assert success[(("finished_reason", "stop"), *model)] == 1
    assert success[(("finished_reason", "length"), *model)] == 1
    assert s["pokomachi:lost_prompt_tokens_total"][(*model, ("reason", "eviction"))] == 48
    assert s["pokomachi:lost_prompt_tokens_total"][(*model, ("reason", "cold"))] == 16
    e2e = s["vllm:e2e_request_latency_seconds_bucket"]
    assert e2e[(("le", "2.5"), *model)] == 1 and e2e[(("le", "15.0"), *model)] == 2
    assert e2e[(("le", "+Inf"), *model)] == 2
    assert s["vllm:e2e_request_latency_seconds_count"][model] == 2
    assert s["vllm:e2e_request_latency_seconds_sum"][model] == pytest.approx(14.1)
    for name in [
        "vllm:time_to_first_token_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
    ]:
        assert s[f"{name}_count"][model] == 2, name
    assert s["vllm:request_prefill_time_seconds_sum"][model] == pytest.approx(1.4)


def test_redis_down_costs_a_warning_not_a_completion(settings, caplog, metrics_prefix, monkeypatch):
    # The failure pauses the process's recording; no pause here, so later tests record.
    monkeypatch.setattr("inference.completions.metrics.PAUSE_AFTER_FAILURE_S", 0.0)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    metrics_record(model=MODEL, metrics=_request(), finish_reason="stop")  # does not raise
    assert "metrics not recorded" in caplog.text
    s = _scrape()
    assert s["pokomachi:metrics_store_up"][()] == 0.0
    assert "vllm:prompt_tokens_total" not in s


def test_completions_on_a_worker_show_up_in_the_web_process(celery_worker_process, metrics_prefix):
    from inference.tasks import chat_completion

    worker = celery_worker_process(env={"POKOMACHI_METRICS_PREFIX": metrics_prefix})
    request = {
        "messages": [{"role": "user", "content": "Tell me about the bakery in town. " * 8}],
        "json_schema": None,
        "max_tokens": 6,
        "temperature": 0.0,
    }
    for _ in range(2):
        result = chat_completion.apply_async(args=[request], queue=worker.queue).get(timeout=120)
        assert "error" not in result
    s = _scrape()
    model = (("model_name", MODEL),)
    prompt = result["metrics"]["num_prompt_tokens"]
    assert s["vllm:prefix_cache_queries_total"][model] == 2 * prompt
    assert s["vllm:prefix_cache_hits_total"][model] == result["metrics"]["num_cached_tokens"] > 0
    assert s["vllm:e2e_request_latency_seconds_count"][model] == 2
    assert sum(s["vllm:request_success_total"].values()) == 2


def _engine_series(name: str, engine: str) -> float | None:
    values = _scrape().get(name, {})
    return values.get((("engine", engine), ("model_name", MODEL)))


def _wait_for(condition, timeout_s: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_live_gauges_follow_a_workers_engine(celery_worker_process, metrics_prefix):
    from inference.tasks import chat_completion

    worker = celery_worker_process(
        env={"POKOMACHI_METRICS_PREFIX": metrics_prefix, "POKOMACHI_STATS_INTERVAL": "0.2"}
    )
    running, usage = "vllm:num_requests_running", "vllm:kv_cache_usage_perc"
    _wait_for(lambda: _engine_series(running, worker.hostname) == 0, what="an idle snapshot")
    assert _engine_series("vllm:num_requests_waiting", worker.hostname) == 0
    assert _engine_series(usage, worker.hostname) == 0
    request = {
        "messages": [{"role": "user", "content": "Tell me everything about the town."}],
        "json_schema": None,
        "max_tokens": 2000,
        "temperature": 0.0,
    }
    result = chat_completion.apply_async(args=[request], queue=worker.queue)
    # While it decodes, the web process sees one running request holding KV blocks...
    _wait_for(lambda: _engine_series(running, worker.hostname) == 1, what="a running request")
    assert 0 < _engine_series(usage, worker.hostname) <= 1
    assert result.get(timeout=300)["metrics"]["num_output_tokens"] > 100
    # ...and none once it finished.
    _wait_for(lambda: _engine_series(running, worker.hostname) == 0, what="the request's end")
    assert _engine_series("pokomachi:engine_steps_total", worker.hostname) > 100
    # A worker that dies stops publishing; its series goes away with the snapshot's TTL.
    worker.kill()
    _wait_for(
        lambda: _engine_series(running, worker.hostname) is None, 10, "the dead worker to drop"
    )


def test_engine_lost_token_fields_become_counters_when_the_engine_has_them(
    metrics_prefix, redis_url
):
    # EngineStats has no num_lost_to_* fields on this branch yet; a snapshot that carries them
    # (as a worker's will once it does) is rendered per reason.
    client = redis.Redis.from_url(redis_url)
    snapshot = {"num_running": 2, "model_name": MODEL, "num_lost_to_retention_grid": 1024}
    client.hset(f"{metrics_prefix}:engine:spark-a@gpu1", mapping=snapshot)
    client.expire(f"{metrics_prefix}:engine:spark-a@gpu1", 60)
    s = _scrape()
    labels = (("engine", "spark-a@gpu1"), ("model_name", MODEL))
    assert s["vllm:num_requests_running"][labels] == 2
    lost = s["pokomachi:engine_lost_prompt_tokens_total"]
    assert lost[(*labels, ("reason", "retention_grid"))] == 1024


def test_kv_tier_counters_reach_metrics_per_request_and_per_engine(
    metrics_prefix, redis_url, tmp_path, monkeypatch
):
    from inference.completions import metrics
    from inference.completions.engine_stats import stats_snapshot
    from inference.engine import EngineConfig, LLMEngine, SamplingParams

    monkeypatch.setattr(metrics._store, "_paused_until", 0.0)  # a test before took Redis down

    metrics_record(
        model=MODEL,
        metrics=_request(num_cached_tokens_host=64, num_cached_tokens_disk=960, kv_load_s=0.25),
        finish_reason="stop",
    )
    engine = LLMEngine(EngineConfig(model=MODEL, num_kv_blocks=64, kv_disk_cache_dir=str(tmp_path)))
    try:
        engine.generate([list(range(1000, 1100))], SamplingParams(max_tokens=2))
        assert engine.flush_kv_tiers()
        snapshot = {**stats_snapshot(engine.stats()), "model_name": MODEL}
    finally:
        engine.shutdown()
    client = redis.Redis.from_url(redis_url)
    client.hset(f"{metrics_prefix}:engine:spark-a@gpu1", mapping=snapshot)
    client.expire(f"{metrics_prefix}:engine:spark-a@gpu1", 60)
    s = _scrape()
    model = (("model_name", MODEL),)
    assert s["pokomachi:prefix_cache_hits_disk_total"][model] == 960
    assert s["pokomachi:prefix_cache_hits_host_total"][model] == 64
    assert s["pokomachi:kv_load_seconds_total"][model] == 0.25
    disk = (("engine", "spark-a@gpu1"), ("model_name", MODEL), ("tier", "disk"))
    assert s["pokomachi:kv_tier_written_bytes_total"][disk] > 0
    assert s["pokomachi:kv_tier_misses_total"][disk] == 1  # the cold prompt's lookup
    assert s["pokomachi:kv_tier_blocks"][disk] == 6  # 100 prompt + 2 output tokens: 6 blocks
    assert s["pokomachi:kv_tier_writes_disabled"][disk] == 0


def test_head_answers_like_get_without_a_body(metrics_prefix):
    get, head = Client().get("/metrics"), Client().head("/metrics")
    assert get.status_code == head.status_code == 200
    assert head["Content-Type"] == get["Content-Type"]
    assert int(head["Content-Length"]) > 0 and head.content == b""
    assert Client().post("/metrics").status_code == 405


def test_grammar_compile_time_is_its_own_histogram(metrics_prefix):
    # issue 33, item 6: compile apart from queue / prefill / decode; a request without a
    # schema time (an external server's) adds nothing.
    metrics_record(model=MODEL, metrics=_request(grammar_compile_s=3.5), finish_reason="stop")
    metrics_record(model=MODEL, metrics=_request(grammar_compile_s=0.0), finish_reason="stop")
    metrics_record(model=MODEL, metrics=_request(), finish_reason="stop")
    s = _scrape()
    model = (("model_name", MODEL),)
    assert s["pokomachi:request_grammar_compile_seconds_sum"][model] == 3.5
    assert s["pokomachi:request_grammar_compile_seconds_count"][model] == 2
    assert s["vllm:request_queue_time_seconds_count"][model] == 3
