"""The run's WebSocket consumer, through the project's ASGI application (origin check, auth
middleware, routing) with Channels' WebsocketCommunicator, on the real Redis channel layer."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from pokosite.asgi import application
from tests.town.factories import run_factory, small_town_factory
from tests.town.live_fixtures import isolated_channel_layer  # noqa: F401
from town import events, services
from town.models import RunEvent
from town.simulation import InlineSend, tick_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("isolated_channel_layer"),
]

ORIGIN = (b"origin", b"http://127.0.0.1")


def _communicator(path: str, *headers: tuple[bytes, bytes]) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, path, headers=[ORIGIN, *headers])


def run_async(fn):
    """Run an async test body on an event loop (no pytest-asyncio needed)."""
    return async_to_sync(fn)()


emit = database_sync_to_async(events.event_emit)


async def _events(ws: WebsocketCommunicator, n: int) -> list[dict]:
    got = [await ws.receive_json_from(timeout=5) for _ in range(n)]
    assert all(m["type"] == "event" for m in got), got
    return got


@pytest.fixture
def run():
    return run_factory(town=small_town_factory())


def test_connect_sends_a_snapshot_then_live_events(run):
    async def body():
        ws = _communicator(f"/ws/runs/{run.pk}/")
        connected, _ = await ws.connect()
        assert connected
        snapshot = await ws.receive_json_from(timeout=5)
        assert snapshot["type"] == "snapshot" and snapshot["seq"] == 0
        assert snapshot["run"]["status"] == "created"
        assert [r["name"] for r in snapshot["residents"]] == ["Aki", "Ben", "Chie", "Dai"]
        assert {p["name"] for p in snapshot["places"]} >= {"Cafe", "Bakery", "Park"}
        assert snapshot["clock"]["hhmm"] == "07:00"
        await database_sync_to_async(services.run_start)(run=run)
        (event,) = await _events(ws, 1)
        assert (event["seq"], event["kind"], event["data"]["status"]) == (1, "run.state", "running")
        assert await ws.receive_nothing(timeout=0.3)
        await ws.disconnect()

    run_async(body)


def test_reconnect_with_after_gets_exactly_the_missed_events_then_live_ones(run):
    async def body():
        ws = _communicator(f"/ws/runs/{run.pk}/")
        await ws.connect()
        await ws.receive_json_from(timeout=5)
        for i in range(3):
            await emit(run_id=run.pk, kind="test.ping", data={"i": i})
        seen = await _events(ws, 3)
        await ws.disconnect()
        for i in range(3, 7):  # while the client is away
            await emit(run_id=run.pk, kind="test.ping", data={"i": i})

        ws = _communicator(f"/ws/runs/{run.pk}/?after={seen[-1]['seq']}")
        await ws.connect()
        missed = await _events(ws, 4)
        assert [m["seq"] for m in missed] == [4, 5, 6, 7]
        assert [m["data"]["i"] for m in missed] == [3, 4, 5, 6]
        await emit(run_id=run.pk, kind="test.ping", data={"i": 7})
        (live,) = await _events(ws, 1)
        assert live["seq"] == 8
        assert await ws.receive_nothing(timeout=0.3)
        await ws.disconnect()

    run_async(body)


def test_a_dropped_group_message_is_filled_from_the_store_and_a_duplicate_is_dropped(run):
    async def body():
        ws = _communicator(f"/ws/runs/{run.pk}/")
        await ws.connect()
        await ws.receive_json_from(timeout=5)
        await emit(run_id=run.pk, kind="test.ping", data={"i": 0})
        (first,) = await _events(ws, 1)

        # Events 2 and 3 are stored but their group messages never arrive (a full channel).
        for seq in (2, 3):
            await database_sync_to_async(RunEvent.objects.create)(
                run_id=run.pk, seq=seq, kind="test.dropped", data={}
            )
        await emit(run_id=run.pk, kind="test.ping", data={"i": 3})
        got = await _events(ws, 3)
        assert [(m["seq"], m["kind"]) for m in got] == [
            (2, "test.dropped"),
            (3, "test.dropped"),
            (4, "test.ping"),
        ]
        # The same event delivered again (another process's late copy): not sent twice.
        layer = get_channel_layer()
        await layer.group_send(
            events.run_group(run.pk), {"type": events.GROUP_MESSAGE_TYPE, "event": first}
        )
        assert await ws.receive_nothing(timeout=0.5)
        await ws.disconnect()

    run_async(body)


def test_events_of_another_run_are_not_sent(run):
    other = run_factory(town=run.town)

    async def body():
        ws = _communicator(f"/ws/runs/{run.pk}/")
        await ws.connect()
        await ws.receive_json_from(timeout=5)
        await emit(run_id=other.pk, kind="test.ping", data={})
        assert await ws.receive_nothing(timeout=0.5)
        await ws.disconnect()

    run_async(body)


def test_after_beyond_the_newest_event_gets_a_snapshot(run):
    async def body():
        await emit(run_id=run.pk, kind="test.ping", data={})
        ws = _communicator(f"/ws/runs/{run.pk}/?after=99")
        await ws.connect()
        message = await ws.receive_json_from(timeout=5)
        assert message["type"] == "snapshot" and message["seq"] == 1
        await ws.disconnect()

    run_async(body)


def test_bad_after_unknown_run_and_foreign_origin_are_refused(run):
    async def body():
        ws = _communicator(f"/ws/runs/{run.pk}/?after=last")
        connected, _ = await ws.connect()
        message = await ws.receive_json_from(timeout=5)
        assert message["type"] == "error" and "whole number" in message["message"]
        assert (await ws.receive_output(timeout=5))["code"] == 4400
        await ws.disconnect()  # the consumer's task ends here, not when the loop closes

        ws = _communicator(f"/ws/runs/{run.pk + 1000}/")
        connected, code = await ws.connect()
        assert (connected, code) == (False, 4404)

        ws = WebsocketCommunicator(
            application, f"/ws/runs/{run.pk}/", headers=[(b"origin", b"http://evil.example")]
        )
        connected, _ = await ws.connect()
        assert not connected

    run_async(body)


def test_login_required_refuses_anonymous_and_admits_a_session_user(run, settings):
    settings.TOWN_VIEW_LOGIN_REQUIRED = True
    user = get_user_model().objects.create_user("watcher", password="pw-for-tests")
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()

    async def body():
        ws = _communicator(f"/ws/runs/{run.pk}/")
        connected, code = await ws.connect()
        assert (connected, code) == (False, 4403)

        ws = _communicator(f"/ws/runs/{run.pk}/", (b"cookie", cookie))
        connected, _ = await ws.connect()
        assert connected
        assert (await ws.receive_json_from(timeout=5))["type"] == "snapshot"
        await ws.disconnect()

    run_async(body)


def test_a_quiet_socket_stays_open_past_the_layers_blocking_wait(run):
    """channels_redis waits 5 s per BZPOPMIN; with redis-py's default 5 s read timeout the
    consumer died after 5 quiet seconds (settings/base.py: channel_layers)."""

    async def body():
        ws = _communicator(f"/ws/runs/{run.pk}/")
        await ws.connect()
        await ws.receive_json_from(timeout=5)
        assert await ws.receive_nothing(timeout=6.5)  # raises if the consumer crashed
        await emit(run_id=run.pk, kind="test.ping", data={})
        (event,) = await _events(ws, 1)
        assert event["seq"] == 1
        await ws.disconnect()

    run_async(body)


def test_a_tick_streams_thinking_then_decisions_in_seq_order(run):
    """A real tick (the tiny model, computed in this process) seen through the socket: each
    resident is thinking (decision.started, as its decision is sent) before its decision."""
    services.run_start(run=run)

    def tick() -> None:
        send = InlineSend(max_workers=run.concurrency)
        try:
            tick_run(run_id=run.pk, send=send, owner="test", poll_s=0.05)
        finally:
            send.shutdown()

    async def body():
        ws = _communicator(f"/ws/runs/{run.pk}/")
        await ws.connect()
        snapshot = await ws.receive_json_from(timeout=5)
        assert not any(r["thinking"] for r in snapshot["residents"])
        await database_sync_to_async(tick, thread_sensitive=False)()
        newest = await database_sync_to_async(events.last_seq)(run_id=run.pk)
        got = await _events(ws, newest - snapshot["seq"])
        assert [m["seq"] for m in got] == list(range(snapshot["seq"] + 1, newest + 1))
        started = {m["data"]["resident"]: m["seq"] for m in got if m["kind"] == "decision.started"}
        applied = {m["data"]["resident"]: m["seq"] for m in got if m["kind"] == "decision.applied"}
        assert set(started) == set(applied) == {r["id"] for r in snapshot["residents"]}
        assert all(started[r] < applied[r] for r in started)
        assert await ws.receive_nothing(timeout=0.3)
        await ws.disconnect()

    run_async(body)


def test_a_connect_while_redis_is_down_is_closed_with_a_reason(run, settings):
    # Nothing listens on port 1: the channel layer's Redis is down (issue 33, item 5).
    from pokosite.settings.base import channel_layers

    settings.CHANNEL_LAYERS = channel_layers("redis://127.0.0.1:1/0", prefix="down")

    async def body():
        ws = _communicator(f"/ws/runs/{run.pk}/")
        connected, _ = await ws.connect(timeout=10)
        assert connected
        error = await ws.receive_json_from(timeout=30)
        assert error["type"] == "error" and "reconnect" in error["message"]
        closed = await ws.receive_output(timeout=5)
        assert closed["type"] == "websocket.close" and closed["code"] == 1013
        assert "unavailable" in closed["reason"]
        await ws.wait()

    run_async(body)
