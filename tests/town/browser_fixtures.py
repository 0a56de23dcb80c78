"""Fixtures and helpers for the browser tests (tests/town/test_browser*.py, test_admin.py).

needs_chromium
    The mark (on a test, or in a module's pytestmark) that skips a browser test without
    Playwright or without Debian's chromium, saying how to install the one missing.

web_server -> WebServer (a str: the base URL)
    daphne on a free port serving pokosite.asgi on the test database and on a channel layer
    prefix of its own, which this process's layer uses too for the test; one daphne per test
    module (the tests' transactional_db empties the database between them); .log() is
    everything it printed (to a file: a pipe nobody reads would fill up and stall it).
browser -> playwright Browser
    Debian's /usr/bin/chromium, headless, launched by Playwright (never a downloaded browser).
open_town_page(opener, url, *, viewport, connected, until, errors, **new_page_kwargs) -> Page
    A new page at a run's live page, once the town view has drawn its first snapshot.
open_town_pages(opener, url, *, until) -> {screen name: Page}
    open_town_page, connected, at each of SCREEN_SIZES (a desktop's and a phone's).
demo_run_start() -> Run
    The demo town's run, started, sampled with a fixed seed (call it through off_loop).
goto_replay(page, url)
    The page at a run's replay, once the replay's data has loaded.
overlap(a, b)
    Whether two boxes ({x, y, w, h}, as the pages measure them) overlap.
off_loop(fn, **kwargs)
    fn called on another thread: Playwright's sync API runs an event loop on the test's thread,
    where Django refuses ORM calls.
GatedSend, TickInBackground
    one tick of a run on another thread, optionally held with its first decisions sent but not
    computed (or some of them computed: GatedSend.release), so the page can be looked at
    mid-tick.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection

from pokosite.settings.base import channel_layers
from tests.child_processes import child_env, daphne_serving
from town import services
from town.demo import demo_town_create
from town.simulation import InlineSend, tick_run

CHROMIUM = Path("/usr/bin/chromium")
# Where the browser tests save what they saw: POKOMACHI_SCREENSHOT_DIR when set, else a
# scratch folder (the README's screenshots in docs/ are made on purpose, not by every test run).
DOCS = Path(os.environ.get("POKOMACHI_SCREENSHOT_DIR") or tempfile.gettempdir()) / "pokomachi-shots"

# The real model (POKOMACHI_MODEL=smollm2-135m-instruct, for the README's screenshots) takes
# minutes per tick on a shared CPU; the tiny default model seconds.
TICK_TIMEOUT_S = 1200.0 if os.environ.get("POKOMACHI_MODEL") else 120.0

# The screens the layout tests look at the live page on: name -> (width, height).
SCREEN_SIZES = {"desktop": (1280, 800), "phone": (390, 844)}


def _why_no_browser() -> str | None:
    """What a browser test lacks here, said as how to get it. Playwright is looked for, not
    imported: conftest.py imports this module for every test."""
    if importlib.util.find_spec("playwright") is None:
        return "pip install playwright (the test extra); no browser download"
    if not CHROMIUM.exists():
        return "needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)"
    return None


_WHY_NO_BROWSER = _why_no_browser()
needs_chromium = pytest.mark.skipif(_WHY_NO_BROWSER is not None, reason=_WHY_NO_BROWSER or "")


CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def off_loop(fn, /, **kwargs):
    """Call fn on another thread: Playwright's sync API keeps an event loop running on this
    one, where Django refuses ORM calls and asgiref refuses async_to_sync."""

    def call():
        try:
            return fn(**kwargs)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


@pytest.fixture(scope="module")
def _module_web_server(redis_url: str, django_db_setup, tmp_path_factory):
    """daphne (child_processes.daphne_serving) on the test database, under a channel layer
    prefix of its own, started once for a test module: its start-up (Django's imports) is
    paid once, not by each test."""
    channel_prefix = f"test-{uuid.uuid4().hex[:10]}"
    env = child_env(
        "tests.town.live_settings", redis_url, {"POKOMACHI_TEST_CHANNEL_PREFIX": channel_prefix}
    )
    with daphne_serving(env, tmp_path_factory.mktemp("daphne") / "daphne.log") as url:
        yield url, channel_prefix


@pytest.fixture
def web_server(_module_web_server, redis_url: str, transactional_db, settings):
    """The module's daphne, with this process's channel layer on its prefix (so the events a
    test's ticks send reach its pages, and nothing of another test run on the same Redis)."""
    url, channel_prefix = _module_web_server
    settings.CHANNEL_LAYERS = channel_layers(redis_url, prefix=channel_prefix)
    return url


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright  # needs_chromium skips without it

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def open_town_page(
    opener, url: str, *, viewport=None, connected=False, until=None, errors=None, **new_page_kwargs
):
    """A new page of `opener` (a Browser, or a BrowserContext with a session cookie) at `url`, a
    run's live page, returned once the town view has drawn its first snapshot; with
    `connected`, once its socket is open too; with `until` (a JS condition), once that holds
    as well. `viewport` ({"width", "height"}) is set before the page loads; `errors`, a list,
    collects the page's uncaught errors from the start; new_page_kwargs go to new_page."""
    page = opener.new_page(**new_page_kwargs)
    if viewport is not None:
        page.set_viewport_size(viewport)
    if errors is not None:
        page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url)
    ready = ["window.townView && townView.snapshots === 1"]
    if connected:
        ready.append("townView.ws && townView.ws.readyState === 1")
    if until:
        ready.append(until)
    page.wait_for_function(" && ".join(ready), timeout=30_000)
    return page


def open_town_pages(opener, url: str, *, until: str) -> dict:
    """open_town_page at each of SCREEN_SIZES, connected and once `until` holds, by screen."""
    return {
        name: open_town_page(
            opener, url, viewport={"width": width, "height": height}, connected=True, until=until
        )
        for name, (width, height) in SCREEN_SIZES.items()
    }


def demo_run_start(concurrency: int = 4):
    """The demo town's run, started, `concurrency` decisions sent at once; sampled with a fixed
    seed: the same decisions every time, and some of them "go". It touches the database: call
    it through off_loop."""
    return services.run_start(
        run=services.run_create(
            town=demo_town_create(seed=0), concurrency=concurrency, seed=4, temperature=1.0
        )
    )


def goto_replay(page, url: str) -> None:
    """`page` at `url`, a run's replay, once the replay has loaded its data."""
    page.goto(url)
    page.wait_for_function("window.townReplay && townReplay.data", timeout=30_000)


def overlap(a: dict, b: dict) -> bool:
    """Overlapping by more than a rounding's half pixel each way."""
    return (
        min(a["x"] + a["w"], b["x"] + b["w"]) - max(a["x"], b["x"]) > 0.5
        and min(a["y"] + a["h"], b["y"] + b["h"]) - max(a["y"], b["y"]) > 0.5
    )


class GatedSend:
    """InlineSend behind a gate: decisions are sent (the residents think) but computed only once
    the test opens the gate, so the page can be looked at mid-tick."""

    def __init__(self, max_workers: int) -> None:
        self.inline = InlineSend(max_workers=max_workers)
        self.gate = threading.Event()
        self._held: list[tuple[int, str, int]] = []
        self._lock = threading.Lock()

    def __call__(self, decision_id: int, node: str, send: int) -> None:
        with self._lock:
            if not self.gate.is_set():
                self._held.append((decision_id, node, send))
                return
        self.inline(decision_id, node, send)

    def release(self, num: int) -> None:
        """Compute the first `num` decisions held so far; the gate stays shut for the rest."""
        with self._lock:
            released, self._held = self._held[:num], self._held[num:]
        for args in released:
            self.inline(*args)

    def open(self) -> None:
        with self._lock:
            self.gate.set()
            held, self._held = self._held, []
        for args in held:
            self.inline(*args)


class TickInBackground:
    """One tick of `run` on another thread (Playwright's loop owns this one)."""

    def __init__(self, run, *, gated: bool) -> None:
        self.send = GatedSend(max_workers=run.concurrency)
        if not gated:
            self.send.open()
        self.error: BaseException | None = None

        def tick() -> None:
            try:
                tick_run(run_id=run.pk, send=self.send, owner="browser-test", poll_s=0.05)
            except BaseException as exc:  # re-raised by join()
                self.error = exc
            finally:
                self.send.inline.shutdown()
                connection.close()

        self.thread = threading.Thread(target=tick, daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.send.open()
        self.thread.join(timeout=TICK_TIMEOUT_S)
        assert not self.thread.is_alive(), "the tick did not finish"
        if self.error is not None:
            raise self.error
