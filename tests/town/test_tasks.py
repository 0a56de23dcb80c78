"""The Celery path for real: the real Redis on 127.0.0.1:6379 and real worker processes
(tests/conftest.py's celery_worker_process), decisions sent by the tick loop to the node's queue."""

from __future__ import annotations

import base64
import json
import re
import time
import uuid

import pytest
import redis

from tests.town.worker_ticks import tick_in_background, wait_for
from town import services
from town.demo import demo_town_create
from town.models import Decision, Run, Tick
from town.rules.schema import REASON_SCHEMA_MAX_CHARS
from town.selectors import run_summary
from town.services.decisions import decision_parse
from town.simulation import tick_run
from town.tasks import decision_send

D = Decision.Status


def _run_ticks(run: Run, num_ticks: int) -> list[Tick]:
    return [
        tick_run(run_id=run.pk, send=decision_send, owner="test", poll_s=0.05)
        for _ in range(num_ticks)
    ]


@pytest.mark.real_model
def test_two_ticks_of_the_demo_town_on_the_real_model(celery_worker_process):
    # All ten of a tick's decisions in flight at once: one batch per tick, not three waves.
    worker = celery_worker_process(env={"POKOMACHI_MODEL": "smollm2-135m-instruct"}, concurrency=10)
    town = demo_town_create(seed=0)
    run = services.run_create(town=town, nodes=[worker.queue], ticks_target=2, concurrency=10)
    run = services.run_start(run=run)
    ticks = _run_ticks(run, 2)
    assert [t.status for t in ticks] == [Tick.Status.DONE] * 2
    run.refresh_from_db()
    assert run.status == Run.Status.FINISHED
    decisions = list(run.decisions.all())
    assert len(decisions) == 20
    for d in decisions:
        value, error = decision_parse(decision=d)  # valid JSON, within its own schema
        assert d.status == D.APPLIED and value is not None, (error, d.raw_output)
        assert d.worker == worker.hostname and d.node == worker.queue
        assert d.num_prompt_tokens > 800 and d.num_output_tokens > 5
        assert d.prefill_s > 0 and d.decode_s > 0 and d.ttft_s > 0 and d.engine_e2e_s > 0
        assert d.queue_s >= 0 and d.app_e2e_s >= d.engine_e2e_s
        assert d.finish_reason == "stop" and d.output_token_ids
    assert sum(d.num_cached_tokens for d in decisions) > 0
    summary = run_summary(run=run)
    print(f"\nreal model, 2 ticks: {dict(summary.rows())}")
    assert summary.token_cache_hit_rate > 0.3
    # The town's rules were applied: whatever the model chose, it was possible when chosen.
    assert sum(1 for d in decisions if d.valid) >= 10
    # Every reason whole, as the model ended it: never cut mid-word by a bound, nor after.
    for d in decisions:
        assert d.reason == json.loads(d.raw_output)["reason"], d.raw_output
        assert re.fullmatch(r"I[ '][A-Za-z '-]*[A-Za-z][.!]", d.reason), d.reason
        # Short of the grammar's bound: the model put the full stop there, not the bound.
        assert len(d.reason) < REASON_SCHEMA_MAX_CHARS, d.reason


def test_a_message_taken_by_a_worker_that_died_before_recording_it_is_sent_again(
    celery_worker_process, redis_url, settings
):
    """kombu's Redis transport takes a message off the queue (BRPOP) before it records it as
    unacknowledged; a worker killed in between loses it and the broker never hands it back.
    Here the test takes it off the real queue itself, as that worker did, and drops it."""
    settings.TOWN_DECISION_RESEND_S = 2.0
    queue = f"test-{uuid.uuid4().hex[:12]}"
    settings.INFERENCE_NODES = [*settings.INFERENCE_NODES, queue]
    town = demo_town_create(seed=0)
    run = services.run_create(town=town, nodes=[queue], ticks_target=1, concurrency=4)
    run = services.run_start(run=run)
    thread, result = tick_in_background(run, poll_s=0.02)
    broker = redis.Redis.from_url(redis_url)
    wait_for(lambda: broker.llen(queue) == 4, "the first 4 decisions were not sent")
    _, raw = broker.brpop([queue], timeout=5)  # the oldest message, as a worker takes it
    lost_id = json.loads(base64.b64decode(json.loads(raw)["body"]))[0][0]
    celery_worker_process(queue)
    thread.join(timeout=120)
    assert not thread.is_alive(), "the tick did not finish"
    assert "error" not in result, result.get("error")
    decisions = {d.pk: d for d in run.decisions.all()}
    assert {d.status for d in decisions.values()} == {D.APPLIED}
    lost = decisions[lost_id]
    assert lost.num_sends >= 2 and lost.started_send >= 2, "the lost message was not replaced"
    # Copies of decisions that were only waiting are dropped: each was computed once.
    assert all(d.attempts == 1 and d.retries == 0 for d in decisions.values())


def test_a_worker_killed_mid_tick_loses_no_decision(celery_worker_process, settings):
    # A message the dying worker had taken off the queue but not recorded is lost (see the
    # test above): the tick loop sends it again after this long.
    settings.TOWN_DECISION_RESEND_S = 5.0
    fast_redelivery = {"POKOMACHI_VISIBILITY_TIMEOUT": "5"}
    worker = celery_worker_process(env=fast_redelivery)
    town = demo_town_create(seed=0)
    run = services.run_create(town=town, nodes=[worker.queue], ticks_target=1, concurrency=4)
    run = services.run_start(run=run)
    thread, result = tick_in_background(run, poll_s=0.02)
    wait_for(
        Decision.objects.filter(run=run, status=D.RUNNING).exists,
        "no decision started on the worker",
    )
    worker.kill()  # SIGKILL, mid-decision
    killed_running = set(
        Decision.objects.filter(run=run, status=D.RUNNING).values_list("pk", flat=True)
    )
    # Its unacknowledged messages go back to the queue once older than the visibility timeout;
    # a worker that starts after that picks them up.
    time.sleep(6)
    celery_worker_process(worker.queue, env=fast_redelivery)
    thread.join(timeout=240)
    assert not thread.is_alive(), "the tick did not finish after the new worker started"
    assert "error" not in result, result.get("error")
    assert result["tick"].status == Tick.Status.DONE
    decisions = list(run.decisions.all())
    assert len(decisions) == 10
    assert {d.status for d in decisions} == {D.APPLIED}, [(d.pk, d.status) for d in decisions]
    retried = [d for d in decisions if d.retries]
    assert retried and all(d.attempts == d.retries + 1 for d in retried)
    assert killed_running <= {d.pk for d in retried}
    assert all(d.worker != worker.hostname for d in retried)
    # Only what the dead worker was computing ran twice; copies sent again ran at most once.
    assert all(d.attempts == (2 if d.pk in killed_running else 1) for d in decisions)
    run.refresh_from_db()
    assert run.status == Run.Status.FINISHED
