"""The Celery app and the `celery_worker_process` fixture: a real worker process on its own
queue, its engine warmed before it is ready, answering control pings, killed like a crash."""

from __future__ import annotations

from inference.fleet.nodes import node_require
from pokosite.celery import app


def test_app_is_configured_from_django_settings(settings):
    assert app.conf.broker_url == settings.CELERY_BROKER_URL
    assert app.conf.task_acks_late is True
    assert app.conf.task_reject_on_worker_lost is True
    assert app.conf.worker_prefetch_multiplier == 1


def test_a_worker_process_serves_its_queue_and_can_be_killed(celery_worker_process):
    worker = celery_worker_process()
    assert worker.queue.startswith("test-")
    assert node_require(worker.queue) == worker.queue  # the fixture configured the node
    assert "engine loaded: model=smollm2-tiny-random" in worker.output()

    replies = app.control.ping(destination=[worker.hostname], timeout=5)
    assert replies == [{worker.hostname: {"ok": "pong"}}]
    queues = app.control.inspect(destination=[worker.hostname], timeout=5).active_queues()
    assert [q["name"] for q in queues[worker.hostname]] == [worker.queue]

    worker.kill()
    assert not worker.is_alive()
    assert app.control.ping(destination=[worker.hostname], timeout=1) == []
