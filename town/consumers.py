"""The run's WebSocket (/ws/runs/<id>/): an interface only. It checks who is asking, joins the
run's group, sends a snapshot (or, with ?after=<seq>, the events missed since), then every
event in seq order, each exactly once.

Events reach the group in commit order from one process but possibly out of order across
processes (the tick loop, the web server's buttons), and a full channel drops messages; a gap
is filled from the stored events (town/events.py says why that is always possible).

Messages to the client: {"type": "snapshot", "seq": N, ...} (town/live.py: run_snapshot),
{"type": "event", "seq", "kind", "at", "data"}, {"type": "error", "message"} before a close.
Close codes: 4400 bad ?after, 4403 not allowed to watch, 4404 no such run.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from town.access import can_watch_runs
from town.events import events_after, last_seq, run_group
from town.live import run_snapshot
from town.models import Run

# A client further behind than this gets a fresh snapshot instead of the events one by one.
MAX_CATCH_UP_EVENTS = 2000


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
        await self.channel_layer.group_add(self.group, self.channel_name)
        newest = await database_sync_to_async(last_seq)(run_id=self.run_id)
        if after is None or after > newest or newest - after > MAX_CATCH_UP_EVENTS:
            await self._send_snapshot()
        else:
            self.last_seq = after
            await self._catch_up(up_to_seq=None)

    async def disconnect(self, code) -> None:
        await self.channel_layer.group_discard(self.group, self.channel_name)

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
