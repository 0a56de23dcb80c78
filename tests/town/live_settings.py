"""Settings for the web server the browser test starts: the test settings, with the channel
layer prefix the test process uses (POKOMACHI_TEST_CHANNEL_PREFIX)."""

from __future__ import annotations

import os

from pokosite.settings.test import *  # noqa: F403
from pokosite.settings.test import REDIS_URL, channel_layers

CHANNEL_LAYERS = channel_layers(
    REDIS_URL, prefix=os.environ.get("POKOMACHI_TEST_CHANNEL_PREFIX", "asgi")
)
