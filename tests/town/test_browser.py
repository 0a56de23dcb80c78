"""The town view in a real browser: Debian's chromium driven by Playwright, against daphne
serving the project's ASGI application on the test database, with ticks run in this process
(the tiny model, InlineSend) and their events reaching the page over the real Redis layer.

Saves town-view.png (1280×800) and town-view-phone.png (390×844) under
$POKOMACHI_SCREENSHOT_DIR/pokomachi-shots (default: the system's temp folder).
"""

from __future__ import annotations

import pytest

from inference.completions.runtime import engine_configured
from tests.town.browser_fixtures import (
    DOCS,
    TickInBackground,
    demo_run_start,
    goto_replay,
    needs_chromium,
    off_loop,
    open_town_page,
)
from tests.town.live_fixtures import isolated_channel_layer  # noqa: F401
from town import services
from town.demo import demo_town_create
from town.events import last_seq
from town.models import Run, RunEvent

pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium]


def _wait_seq(page, seq: int) -> None:
    page.wait_for_function(f"window.townView.seq === {seq}", timeout=30_000)


def _events(run, kind: str | None = None) -> list[RunEvent]:
    events = RunEvent.objects.filter(run=run).order_by("seq")
    return list(events.filter(kind=kind) if kind else events)


def _socket_counts(page) -> dict:
    return page.evaluate(
        "({snapshots: townView.snapshots, duplicates: townView.duplicates,"
        " gaps: townView.gaps, connects: townView.connects, closes: townView.closes})"
    )


WALKER_JS = """(id) => {
    const m = townView.map, f = m.residents.get(id), p = m.position(f, performance.now());
    const t = (performance.now() - f.t0) / f.duration;
    return {t, x: p.x, y: p.y, fromX: f.fromX, fromY: f.fromY, toX: f.toX, toY: f.toY};
}"""


@pytest.fixture
def fresh_engine():
    """This process's engine built afresh (an empty prefix cache) for one test. The sampled
    decisions then depend on the test alone: what earlier tests left cached changes where a
    prompt's blocks lie, so the attention's floats in the last bits, and sampling at
    temperature 1 follows them."""
    with engine_configured() as engine:
        yield engine


@pytest.mark.usefixtures("fresh_engine")
def test_the_live_page_draws_the_town_follows_ticks_and_survives_reconnects(web_server, browser):
    run = off_loop(demo_run_start)
    errors: list[str] = []
    # The places and the residents drawn, from one snapshot.
    page = open_town_page(
        browser,
        f"{web_server}/runs/{run.pk}/",
        viewport={"width": 1280, "height": 800},
        connected=True,
        until="townView.map.stats.placesDrawn === 12 && townView.map.stats.residentsDrawn === 10",
        errors=errors,
    )
    snapshot_seq = page.evaluate("townView.seq")
    assert snapshot_seq == off_loop(last_seq, run_id=run.pk) == 1  # the run.state of run_start
    assert page.locator("#stat-clock").inner_text() == "day 1 07:00 morning"
    assert page.evaluate("townView.map.stats.thinkingDrawn") == 0
    # 1280×800: no sideways scrolling, the map and the side panel side by side.
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    map_box = page.locator("#town-map").bounding_box()
    side_box = page.locator("aside.side").bounding_box()
    assert side_box["x"] >= map_box["x"] + map_box["width"] - 1
    assert side_box["x"] + side_box["width"] <= 1280

    # Tick 1, held mid-tick: the four residents whose decisions were sent are drawn thinking.
    tick = TickInBackground(run, gated=True)
    page.wait_for_function("townView.map.stats.thinkingDrawn === 4", timeout=30_000)
    started = off_loop(_events, run=run, kind="decision.started")
    assert len(started) == 4 and page.evaluate("townView.thinkingEvents") == 4
    thinking = page.evaluate(
        "[...townView.map.residents.values()].filter((f) => f.thinking).map((f) => f.id)"
    )
    assert sorted(thinking) == sorted(e.data["resident"] for e in started)
    assert page.locator("#feed .feed-item").count() == 0
    tick.join()
    newest = off_loop(last_seq, run_id=run.pk)
    _wait_seq(page, newest)

    # Every decision: thought about (started), then in the feed; some residents walk.
    assert page.evaluate("townView.thinkingEvents") == 10
    page.wait_for_function("townView.map.stats.thinkingDrawn === 0", timeout=5_000)
    applied = off_loop(_events, run=run, kind="decision.applied")
    feed = page.locator("#feed .feed-item")
    assert feed.count() == 10
    assert sorted(feed.nth(i).get_attribute("data-seq") for i in range(10)) == sorted(
        str(e.seq) for e in applied
    )
    # The feed is newest first, one line per decision in the order they were answered (each
    # updated in place when the tick applied it).
    first = off_loop(_events, run=run, kind="decision.answered")[0].data
    assert feed.nth(9).locator("b").inner_text() == first["resident_name"]
    moved = off_loop(_events, run=run, kind="resident.moved")
    assert moved, "nobody moved in the first tick; the test needs a walk to watch"
    assert page.evaluate("townView.map.stats.walksStarted") == len(moved)
    walker = moved[0].data
    # Animated, not teleported: mid-walk the figure is between where it was and where it goes.
    page.wait_for_function("townView.map.stats.walking > 0", timeout=5_000)
    at = page.evaluate(WALKER_JS, walker["resident_id"])
    assert 0 < at["t"] < 1, at
    assert abs(at["x"] - at["toX"]) + abs(at["y"] - at["toY"]) > 1, at
    assert abs(at["x"] - at["fromX"]) + abs(at["y"] - at["fromY"]) > 1, at
    assert page.locator("#stat-clock").inner_text() == "day 1 09:00 morning"
    assert page.locator("#stat-tick").inner_text() == "1"
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

    # Tick 2, held: thinking again, speech bubbles of tick 1 still up. The screenshot.
    tick = TickInBackground(run, gated=True)
    page.wait_for_function("townView.map.stats.thinkingDrawn === 4", timeout=30_000)
    DOCS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(DOCS / "town-view.png"))
    # A page opened now starts from a snapshot that already shows who is thinking.
    other = open_town_page(
        browser,
        f"{web_server}/runs/{run.pk}/",
        viewport={"width": 1280, "height": 800},
        until="townView.map.stats.thinkingDrawn === 4",
    )
    other.close()

    # Away mid-tick: the tick ends, the run is paused and stepped; back, it catches up exactly.
    page.evaluate("townView.drop()")
    page.wait_for_function("townView.ws === null")
    tick.join()
    off_loop(services.run_pause, run=run)
    off_loop(services.run_step, run=run)
    page.evaluate("townView.resume()")
    newest = off_loop(last_seq, run_id=run.pk)
    _wait_seq(page, newest)
    page.wait_for_function("townView.map.stats.thinkingDrawn === 0", timeout=5_000)
    assert page.locator("#feed .feed-item").count() == 20
    assert page.locator("#stat-status").inner_text() == "paused"

    # Dropped and back while a tick streams its events: nothing lost, nothing doubled.
    tick = TickInBackground(run, gated=False)
    page.wait_for_function("townView.thinkingEvents > 20", timeout=30_000)
    page.evaluate("townView.drop()")
    page.wait_for_function("townView.ws === null")
    page.evaluate("townView.resume()")
    tick.join()
    newest = off_loop(last_seq, run_id=run.pk)
    _wait_seq(page, newest)
    page.wait_for_timeout(500)  # anything doubled or late would arrive now
    assert page.evaluate("townView.appliedSeqs") == list(range(snapshot_seq + 1, newest + 1))
    counts = _socket_counts(page)
    # One snapshot, no duplicate, no gap, and no connect but the two resumes.
    assert (counts["snapshots"], counts["duplicates"], counts["gaps"], counts["connects"]) == (
        1, 0, 0, 3,
    ), f"{counts}\ndaphne:\n{web_server.log()[-6000:]}"  # fmt: skip
    assert all(close["dropped"] for close in counts["closes"]), counts
    assert page.evaluate("townView.thinkingEvents") == 30
    assert page.locator("#feed .feed-item").count() == 30
    assert page.locator("#stat-tick").inner_text() == "3"

    # The replay of the same run: frame by frame from the stored decisions.
    goto_replay(page, f"{web_server}/runs/{run.pk}/replay/")
    assert page.evaluate("townReplay.data.frames.length") == 4  # 3 ticks, then the end
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


@pytest.mark.usefixtures("fresh_engine")
def test_the_live_page_fits_a_phone_screen(web_server, browser):
    run = off_loop(demo_run_start, concurrency=10)  # the tick's ten decisions in one batch
    TickInBackground(run, gated=False).join()
    page = open_town_page(
        browser,
        f"{web_server}/runs/{run.pk}/",
        viewport={"width": 390, "height": 844},
        until="townView.map.stats.placesDrawn === 12 && townView.map.stats.residentsDrawn === 10",
        device_scale_factor=2,
    )
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    box = page.locator("#town-map").bounding_box()
    assert box["width"] <= 390 and box["height"] >= 300
    # The panel stacks under the map, as wide as the screen; the feed has the tick.
    side = page.locator("aside.side").bounding_box()
    assert side["y"] >= box["y"] + box["height"] - 1 and side["width"] <= 390
    assert page.locator("#feed .feed-item").count() == 10
    page.wait_for_timeout(300)
    DOCS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(DOCS / "town-view-phone.png"))


def test_staff_buttons_control_the_run_and_the_page_follows(web_server, browser):
    """Logged in as staff (a session cookie from the test database): the buttons call the run
    services, their run.state events come back over the socket, a refusal is shown."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    def staff_session() -> str:
        user = get_user_model().objects.create_user("boss", password="pw-for-tests", is_staff=True)
        client = Client()
        client.force_login(user)
        return client.cookies["sessionid"].value

    run = off_loop(lambda: services.run_create(town=demo_town_create(seed=0)))
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.add_cookies(
        [{"name": "sessionid", "value": off_loop(staff_session), "url": web_server}]
    )
    page = open_town_page(context, f"{web_server}/runs/{run.pk}/")

    def shown() -> list[str]:
        buttons = page.locator("#controls button:visible")
        return [buttons.nth(i).get_attribute("data-control") for i in range(buttons.count())]

    # Only the buttons the run's status allows, by the admin's rule, as the status changes.
    assert shown() == off_loop(services.run_controls_available, run=run) == [
        "start", "step", "stop",
    ]  # fmt: skip
    for control, status, seq, buttons in [
        ("start", "running", 1, ["pause", "stop"]),
        ("pause", "paused", 2, ["resume", "step", "stop"]),
    ]:
        page.locator(f'button[data-control="{control}"]').click()
        _wait_seq(page, seq)
        assert page.locator("#stat-status").inner_text() == status
        assert shown() == buttons, (control, shown())
    page.locator('button[data-control="step"]').click()
    _wait_seq(page, 3)
    run = off_loop(lambda: Run.objects.get(pk=run.pk))
    assert (run.status, run.num_steps_pending) == ("paused", 1)
    # A paused run is resumed, not started: the hidden button, pressed anyway (a page left
    # open elsewhere), is refused with the service's reason.
    page.evaluate("document.querySelector('button[data-control=\"start\"]').click()")
    page.wait_for_function("!document.getElementById('map-note').hidden", timeout=10_000)
    assert "cannot start" in page.locator("#map-note").inner_text()
    page.locator('button[data-control="stop"]').click()
    _wait_seq(page, 4)
    assert page.locator("#stat-status").inner_text() == "stopped"
    assert shown() == ["resume", "step"]
    context.close()
