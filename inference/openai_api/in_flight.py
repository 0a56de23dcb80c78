"""Per-identity limit on /v1 completions in flight, shared by every web process through Redis.

Each identity (request_identity: the Access identity, the service token, the Django user, or
the one anonymous caller) holds at most settings.OPENAI_MAX_IN_FLIGHT_PER_IDENTITY completions
at once: one more is refused at once with 429 and a Retry-After, before anything is sent to a
node. A slot is a member of the identity's sorted set, scored by when it was taken, and is
removed when the completion ends (answered, failed, or its client left). A web process that
died holding slots cannot leak them for long: slots older than OPENAI_API_TIMEOUT_S (by then
the completion was given up anyway) are dropped on every acquire.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import redis.asyncio
from django.conf import settings

from inference.openai_api.protocol import RateLimitError

logger = logging.getLogger(__name__)

ANONYMOUS = "anonymous"
SLOT_GRACE_S = 30.0  # past the deadline: the completion's own 504 comes first
RETRY_AFTER_S = 2


@dataclass(frozen=True, slots=True)
class InFlightSlot:
    key: str
    member: str


class InFlightLimitError(RateLimitError):
    """429: the identity has its share of completions in flight."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, retry_after_s=retry_after_s, code="too_many_requests_in_flight")


def _client() -> redis.asyncio.Redis:
    return redis.asyncio.Redis.from_url(
        settings.REDIS_URL, socket_timeout=2.0, socket_connect_timeout=2.0
    )


def _key(identity: str | None) -> str:
    return f"{settings.INFERENCE_STREAM_PREFIX}:in-flight:{identity or ANONYMOUS}"


async def in_flight_acquire(identity: str | None) -> InFlightSlot | None:
    """Take a slot for one completion of `identity`; InFlightLimitError (429) when it has
    OPENAI_MAX_IN_FLIGHT_PER_IDENTITY in flight already. None when the limit is off (0). With
    Redis down nothing is counted: the send that follows answers 503
    (inference/fleet/task_queue.py)."""
    limit = settings.OPENAI_MAX_IN_FLIGHT_PER_IDENTITY
    if limit <= 0:
        return None
    slot = InFlightSlot(_key(identity), uuid.uuid4().hex)
    now = time.time()
    stale = now - settings.OPENAI_API_TIMEOUT_S - SLOT_GRACE_S
    client = _client()
    try:
        async with client.pipeline(transaction=True) as pipe:
            pipe.zremrangebyscore(slot.key, "-inf", stale)
            pipe.zadd(slot.key, {slot.member: now})
            pipe.zcard(slot.key)
            pipe.expire(slot.key, int(settings.OPENAI_API_TIMEOUT_S + SLOT_GRACE_S) + 1)
            _, _, num_in_flight, _ = await pipe.execute()
        if num_in_flight > limit:
            await client.zrem(slot.key, slot.member)
            raise InFlightLimitError(
                f"too many completions in flight for this caller: {limit} at most at once "
                f"(OPENAI_MAX_IN_FLIGHT_PER_IDENTITY, POKOMACHI_OPENAI_MAX_IN_FLIGHT); wait for "
                "one to finish, then retry",
                retry_after_s=RETRY_AFTER_S,
            )
    except (redis.RedisError, OSError) as exc:
        logger.warning("in-flight limit not checked: Redis is not answering (%s)", exc)
        return None
    finally:
        with contextlib.suppress(redis.RedisError, OSError):
            await client.aclose()
    return slot


async def in_flight_release(slot: InFlightSlot | None) -> None:
    """Give the slot back (never raises: a slot not given back expires, see above)."""
    if slot is None:
        return
    client = _client()
    try:
        await client.zrem(slot.key, slot.member)
    except (redis.RedisError, OSError) as exc:
        logger.warning("in-flight slot %s not released (%s); it expires", slot.member, exc)
    finally:
        with contextlib.suppress(redis.RedisError, OSError):
            await client.aclose()


@contextlib.asynccontextmanager
async def in_flight(identity: str | None) -> AsyncIterator[None]:
    slot = await in_flight_acquire(identity)
    try:
        yield
    finally:
        await in_flight_release(slot)
