"""The run's WebSocket (/ws/runs/<id>/): an interface only. It checks who is asking, joins the
run's group, sends a snapshot (or, with ?after=<seq>, the events missed since), then every
event in seq order, each exactly once.

Events reach the group in commit order from one process but possibly out of order across
processes (the tick loop, the web server's buttons), and a full channel drops messages; a gap
is filled from the stored events (town/events.py says why that is always possible).

Messages to the client: {"type": "snapshot", "seq": N, ...} (town/live.py: run_snapshot),
{"type": "event", "seq", "kind", "at", "data"}, {"type": "error", "message"} before a close.
Close codes: 4400 bad ?after, 4403 not allowed to watch, 4404 no such run, 1013 (try again
later) when the channel layer's Redis does not answer: the client is told why and reconnects.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qs

import redis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from town.access import can_watch_runs
from town.events import events_after, last_seq, run_group
from town.live import run_snapshot
from town.models import Run

logger = logging.getLogger(__name__)

# A client further behind than this gets a fresh snapshot instead of the events one by one.
MAX_CATCH_UP_EVENTS = 2000
UNAVAILABLE_CLOSE_CODE = 1013  # RFC 6455: "try again later"


def websocket_allowed(scope) -> bool:
    """The consumer's whole authentication check (extend here, e.g. for Cloudflare Access
    claims a middleware put into the scope)."""
    return can_watch_runs(scope.get("user"))


def _parse_after(scope) -> tuple[int | None, str]:
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    values = query.get("after")
    if not values:
        return None, ""
    try:
        after = int(values[0])
    except ValueError:
        after = -1
    if after < 0:
        return None, f"after={values[0]!r}: give the last seq you saw, a whole number >= 0"
    return after, ""


class RunConsumer(AsyncJsonWebsocketConsumer):
    _is_accepted = False
    _is_closed = False

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except (redis.RedisError, OSError) as exc:
            # The layer's receive loop (Channels runs it beside the socket's) lost its Redis:
            # at connect, or later mid-session.
            await self._close_unavailable(exc)

    async def accept(self, subprotocol=None, headers=None) -> None:
        await super().accept(subprotocol, headers)
        self._is_accepted = True

    async def close(self, code=None, reason=None) -> None:
        self._is_closed = True
        await super().close(code, reason)

    async def connect(self) -> None:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        self.last_seq = 0
        self.group = run_group(self.run_id)
        if not await database_sync_to_async(websocket_allowed)(self.scope):
            await self.close(code=4403)
            return
        if not await database_sync_to_async(Run.objects.filter(pk=self.run_id).exists)():
            await self.close(code=4404)
            return
        after, problem = _parse_after(self.scope)
        await self.accept()
        if problem:
            await self.send_json({"type": "error", "message": problem})
            await self.close(code=4400)
            return
        # Join first, then read: an event committed meanwhile is both read and queued, and
        # the queued copy is dropped as already sent.
        try:
            await self.channel_layer.group_add(self.group, self.channel_name)
        except (redis.RedisError, OSError) as exc:
            await self._close_unavailable(exc)
            return
        newest = await database_sync_to_async(last_seq)(run_id=self.run_id)
        if after is None or after > newest or newest - after > MAX_CATCH_UP_EVENTS:
            await self._send_snapshot()
        else:
            self.last_seq = after
            await self._catch_up(up_to_seq=None)

    async def disconnect(self, code) -> None:
        try:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        except (redis.RedisError, OSError) as exc:  # the group's entry expires by itself
            logger.info("run %s: leaving the group failed (%s)", self.run_id, exc)

    async def _close_unavailable(self, exc: BaseException) -> None:
        """The live feed cannot be joined (Redis is down): say so, then close (1013: try again
        later), rather than leave an accepted socket that never sends anything."""
        if self._is_closed:
            return
        logger.warning("%s: the live feed is unavailable (%s)", self.scope["path"], exc)
        if not self._is_accepted:
            await self.accept()
        message = "the live feed is unavailable (its Redis does not answer): reconnect shortly"
        await self.send_json({"type": "error", "message": message})
        await self.close(code=UNAVAILABLE_CLOSE_CODE, reason="live feed unavailable; retry")

    async def receive_json(self, content, **kwargs) -> None:
        # The stream is one way; a client that wants to resume reconnects with ?after=<seq>.
        await self.send_json(
            {"type": "error", "message": "this socket only sends; reconnect with ?after=<seq>"}
        )

    async def run_event(self, message) -> None:
        """A group message from town/events.py."""
        event = message["event"]
        if event["seq"] <= self.last_seq:
            return  # sent already (read while catching up)
        if event["seq"] > self.last_seq + 1:
            await self._catch_up(up_to_seq=event["seq"] - 1)
        await self._send_event(event)

    async def _send_snapshot(self) -> None:
        snapshot = await database_sync_to_async(run_snapshot)(run_id=self.run_id)
        self.last_seq = snapshot["seq"]
        await self.send_json(snapshot)

    async def _catch_up(self, *, up_to_seq: int | None) -> None:
        missed = await database_sync_to_async(events_after)(
            run_id=self.run_id, after_seq=self.last_seq, up_to_seq=up_to_seq
        )
        for event in missed:
            await self._send_event(event)

    async def _send_event(self, event) -> None:
        assert event["seq"] == self.last_seq + 1, (event["seq"], self.last_seq)
        self.last_seq = event["seq"]
        await self.send_json({"type": "event", **event})
