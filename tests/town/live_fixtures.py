"""Fixtures for the live view's tests (imported by test_events, test_consumers, test_views,
test_browser).

isolated_channel_layer -> str
    The real Redis channel layer (settings.REDIS_URL, db 15) under a prefix of its own, so
    another test run on the same Redis, whose runs have the same ids, never reaches these
    groups. Returns the prefix (a child process gets it through POKOMACHI_TEST_CHANNEL_PREFIX,
    read by tests/town/live_settings.py).
"""

from __future__ import annotations

import uuid

import pytest

from pokosite.settings.base import channel_layers


@pytest.fixture
def isolated_channel_layer(redis_url: str, settings) -> str:
    prefix = f"test-{uuid.uuid4().hex[:10]}"
    settings.CHANNEL_LAYERS = channel_layers(redis_url, prefix=prefix)
    return prefix
