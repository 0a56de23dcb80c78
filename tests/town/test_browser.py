"""The town view in a real browser: Debian's chromium driven by Playwright, against daphne
serving the project's ASGI application on the test database, with ticks run in this process
(the tiny model, InlineSend) and their events reaching the page over the real Redis layer.

Saves docs/town-view.png (1280×800) and docs/town-view-phone.png (390×844).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection

from tests.town.live_fixtures import isolated_channel_layer  # noqa: F401
from town import services
from town.demo import demo_town_create
from town.events import last_seq
from town.models import RunEvent
from town.simulation import InlineSend, tick_run

CHROMIUM = Path("/usr/bin/chromium")
REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS = REPO_ROOT / "docs"

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="pip install playwright (the test extra); no browser download"
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)",
    ),
]

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def web_server(request, redis_url: str, transactional_db):
    """daphne on a free port, on this test's database and channel layer prefix."""
    channel_prefix = request.getfixturevalue("isolated_channel_layer")
    port = _free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.town.live_settings",
        "POKOMACHI_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        "POKOMACHI_TEST_REDIS_URL": redis_url,
        "POKOMACHI_TEST_CHANNEL_PREFIX": channel_prefix,
        "PYTHONUNBUFFERED": "1",
    }
    argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(
        [*argv, "pokosite.asgi:application"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"daphne did not serve {url}/healthz; its output:\n{process.stdout.read()}")
        time.sleep(0.3)
    yield url
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def _tick(run) -> None:
    def tick() -> None:
        send = InlineSend(max_workers=run.concurrency)
        try:
            tick_run(run_id=run.pk, send=send, owner="browser-test", poll_s=0.05)
        finally:
            send.shutdown()

    off_loop(tick)


def _wait_seq(page, seq: int) -> None:
    page.wait_for_function(f"window.townView.seq === {seq}", timeout=30_000)


def test_the_live_page_draws_the_town_follows_a_tick_and_survives_a_reconnect(web_server, browser):
    run = off_loop(
        lambda: services.run_start(
            # Sampled with a fixed seed: the same decisions every time, and some of them "go".
            run=services.run_create(
                town=demo_town_create(seed=0), concurrency=4, seed=1, temperature=1.0
            )
        )
    )
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{web_server}/runs/{run.pk}/")

    page.wait_for_function(
        "window.townView && townView.snapshots === 1 && townView.ws"
        " && townView.ws.readyState === 1 && townView.map.stats.placesDrawn === 12"
        " && townView.map.stats.residentsDrawn === 10",
        timeout=30_000,
    )
    snapshot_seq = page.evaluate("townView.seq")
    assert snapshot_seq == off_loop(last_seq, run_id=run.pk) == 1  # the run.state of run_start
    assert page.locator("#stat-clock").inner_text() == "day 1 07:00 morning"

    # One tick: every resident thinks, decides (the feed), some walk to another place.
    _tick(run)
    newest = off_loop(last_seq, run_id=run.pk)
    _wait_seq(page, newest)
    moved = off_loop(
        lambda: list(RunEvent.objects.filter(run=run, kind="resident.moved").order_by("seq"))
    )
    assert moved, "nobody moved in the first tick; the test needs a walk to watch"
    assert page.evaluate("townView.map.stats.walksStarted") == len(moved)
    page.wait_for_function("townView.map.stats.walking > 0", timeout=5_000)
    assert page.locator("#feed .feed-item").count() == 10
    assert page.locator("#stat-clock").inner_text() == "day 1 09:00 morning"
    assert page.locator("#stat-tick").inner_text() == "1"
    page.wait_for_timeout(700)  # mid-walk, bubbles up
    DOCS.mkdir(exist_ok=True)
    page.screenshot(path=str(DOCS / "town-view.png"))

    walker = moved[0].data
    page.wait_for_function("townView.map.stats.walking === 0", timeout=10_000)
    arrived = page.evaluate(
        """(id) => {
            const f = townView.map.residents.get(id);
            const slot = townView.map.slotXY(f);
            return [f.placeId, Math.round(f.toX - slot.x), Math.round(f.toY - slot.y)];
        }""",
        walker["resident_id"],
    )
    assert arrived == [walker["to_place_id"], 0, 0]

    # Away while the run is paused, stepped and ticked: the page must catch up exactly.
    page.evaluate("townView.drop()")
    page.wait_for_function("townView.ws === null")
    off_loop(services.run_pause, run=run)
    off_loop(services.run_step, run=run)
    _tick(run)
    newest = off_loop(last_seq, run_id=run.pk)
    page.evaluate("townView.resume()")
    _wait_seq(page, newest)
    page.wait_for_timeout(300)  # anything doubled would arrive now
    applied = page.evaluate("townView.appliedSeqs")
    assert applied == list(range(snapshot_seq + 1, newest + 1))
    snapshots, duplicates, connects = page.evaluate(
        "[townView.snapshots, townView.duplicates, townView.connects]"
    )
    # One snapshot, nothing doubled; a loaded machine may drop the socket once more, and the
    # client then resumes from its last seq (the applied list above shows nothing was lost).
    assert (snapshots, duplicates) == (1, 0)
    assert connects >= 2
    assert page.locator("#feed .feed-item").count() == 20
    assert page.locator("#stat-tick").inner_text() == "2"
    assert page.locator("#stat-status").inner_text() == "paused"

    # The replay of the same run: frame by frame from the stored decisions.
    page.goto(f"{web_server}/runs/{run.pk}/replay/")
    page.wait_for_function("window.townReplay && townReplay.data", timeout=30_000)
    assert page.evaluate("townReplay.data.frames.length") == 3  # 2 ticks, then the end
    assert page.locator("#feed .feed-item").count() == 10  # tick 0's decisions
    assert page.locator("#stat-clock").inner_text() == "day 1 07:00 morning"
    page.evaluate("townReplay.show(1, true)")
    page.wait_for_function("townReplay.map.stats.walking > 0", timeout=5_000)
    assert page.evaluate("townReplay.map.stats.walksStarted") == len(moved)
    assert page.locator("#feed .feed-item").count() == 20
    assert page.locator("#stat-clock").inner_text() == "day 1 09:00 morning"
    page.wait_for_function("townReplay.map.stats.walking === 0", timeout=10_000)
    placed = page.evaluate(
        "(id) => townReplay.map.residents.get(id).placeId", walker["resident_id"]
    )
    assert placed == walker["to_place_id"]
    assert not errors, errors


def test_the_live_page_fits_a_phone_screen(web_server, browser):
    run = off_loop(lambda: services.run_create(town=demo_town_create(seed=0)))
    page = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)
    page.goto(f"{web_server}/runs/{run.pk}/")
    page.wait_for_function(
        "window.townView && townView.snapshots === 1 && townView.map.stats.placesDrawn === 12",
        timeout=30_000,
    )
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    box = page.locator("#town-map").bounding_box()
    assert box["width"] <= 390 and box["height"] >= 300
    page.wait_for_timeout(300)
    DOCS.mkdir(exist_ok=True)
    page.screenshot(path=str(DOCS / "town-view-phone.png"))
