"""What a person watching sees, in Debian's chromium at 1280 px and at a phone's 390 px: each
decision on the map and in the feed as soon as it is answered (long before its tick ends), the
same words in both, and pages that fit a phone (nothing wider than the screen, no place's name
over a resident's name), on the live page and the admin's run page.

Saves watch-*.png under $POKOMACHI_SCREENSHOT_DIR/pokomachi-shots (default: the temp folder).
"""

from __future__ import annotations

import pytest

from inference.completions.runtime import engine_configured
from tests.town.browser_fixtures import (
    DOCS,
    TickInBackground,
    demo_run_start,
    needs_chromium,
    off_loop,
    open_town_pages,
    overlap,
)
from tests.town.live_fixtures import isolated_channel_layer  # noqa: F401
from town.models import RunEvent

pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium]


# Every element wider than the screen, or reaching past its right edge (what makes a phone
# scroll sideways), with the page's own scroll width.
TOO_WIDE_JS = """() => {
    const w = document.documentElement.clientWidth;
    const name = (n) => n.tagName.toLowerCase() + (n.id ? '#' + n.id : '')
        + (typeof n.className === 'string' && n.className ? '.' + n.className.trim()
            .split(/\\s+/).join('.') : '');
    const wide = [...document.querySelectorAll('body *')].filter((n) => {
        const r = n.getBoundingClientRect();
        return r.width > w + 0.5 || r.right > w + 0.5;
    }).map((n) => `${name(n)} ${Math.round(n.getBoundingClientRect().width)} px`);
    return {scrollWidth: document.documentElement.scrollWidth, width: w, wide};
}"""

# Each place's name and each resident's name (as the map draws it, standing still) in page
# pixels.
NAME_BOXES_JS = """() => {
    const m = townView.map, canvas = m.canvas.getBoundingClientRect();
    const labels = [...document.querySelectorAll('.place-label')].map((n) => {
        const r = n.getBoundingClientRect();
        return {x: r.left, y: r.top, w: r.width, h: r.height, what: n.textContent};
    });
    const names = [...m.residents.values()].map((f) => {
        const r = m.nameRect(f, m.position(f, performance.now()));
        return {x: canvas.left + r.x, y: canvas.top + r.y, w: r.w, h: r.h, what: f.name};
    });
    return {labels, names};
}"""


def _fits(page, what: str) -> None:
    m = page.evaluate(TOO_WIDE_JS)
    assert m["scrollWidth"] <= m["width"] and not m["wide"], f"{what}: {m}"


def _no_label_over_a_name(page, what: str) -> None:
    page.wait_for_function("townView.map.stats.walking === 0", timeout=10_000)
    m = page.evaluate(NAME_BOXES_JS)
    assert len(m["labels"]) == 12 and len(m["names"]) == 10
    covered = [
        f"{label['what']!r} over {name['what']!r}"
        for label in m["labels"]
        for name in m["names"]
        if overlap(label, name)
    ]
    covered += [
        f"{a['what']!r} over {b['what']!r}"
        for i, a in enumerate(m["labels"])
        for b in m["labels"][i + 1 :]
        if overlap(a, b)
    ]
    assert not covered, f"{what}: " + "; ".join(covered)


def _shot(page, name: str) -> None:
    DOCS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(DOCS / f"{name}.png"))


def _staff_cookie(web_server) -> dict:
    from django.contrib.auth import get_user_model
    from django.test import Client

    def session() -> str:
        user = get_user_model().objects.create_superuser("boss", password="pw-for-tests")
        client = Client()
        client.force_login(user)
        return client.cookies["sessionid"].value

    return {"name": "sessionid", "value": off_loop(session), "url": web_server}


def _tick_events(run) -> list[str]:
    return list(RunEvent.objects.filter(run=run).order_by("seq").values_list("kind", flat=True))


def test_each_decision_shows_as_it_lands_and_the_pages_fit_a_phone(web_server, browser):
    with engine_configured():  # a fresh engine: this test's decisions depend on it alone
        # All ten decisions sent at once: once the first is shown, the other nine are computed
        # in one batch, not in waves of four.
        run = off_loop(demo_run_start, concurrency=10)
        context = browser.new_context()
        context.add_cookies([_staff_cookie(web_server)])
        pages = open_town_pages(
            context,
            f"{web_server}/runs/{run.pk}/",
            until="townView.map.stats.residentsDrawn === 10",
        )
        for name, page in pages.items():
            _no_label_over_a_name(page, f"{name}, everyone at home")

        # One decision answered, the tick held on the others: it is on both pages' maps and
        # feeds, with the same words, while the others think and the tick is not over.
        tick = TickInBackground(run, gated=True)
        for page in pages.values():
            page.wait_for_function("townView.map.stats.thinkingDrawn === 10", timeout=30_000)
        tick.send.release(1)
        for name, page in pages.items():
            page.wait_for_function("townView.answeredEvents === 1", timeout=60_000)
            item = page.locator("#feed .feed-item")
            assert item.count() == 1 and "has decided:" in item.inner_text(), name
            resident_id = int(item.get_attribute("data-resident-id"))
            bubble = page.locator(f'.bubble[data-resident-id="{resident_id}"]')
            bubble.wait_for(timeout=5_000)
            said = page.evaluate("(id) => townView.map.residents.get(id).said.text", resident_id)
            assert bubble.inner_text() == said, name
            reason = item.locator(".reason")
            if reason.count():
                assert reason.inner_text() == f"“{said}”", name
            else:  # an answer the town cannot use: no words, on the map or in the feed
                assert said == "(stays put)", (name, said)
        kinds = off_loop(_tick_events, run=run)
        assert "decision.answered" in kinds and "tick.advanced" not in kinds
        assert tick.thread.is_alive()
        _shot(pages["desktop"], "watch-desktop-mid-tick")

        # The tick ends: one line per decision (answered, then applied in place), and every
        # resident's words still up on the map, the same as its line in the feed.
        tick.join()
        for name, page in pages.items():
            page.wait_for_function(
                "document.querySelectorAll('#feed .feed-item:not(.decided)').length === 10",
                timeout=30_000,
            )
            assert page.locator("#feed .feed-item").count() == 10
            said = page.evaluate(
                "Object.fromEntries([...townView.map.residents.values()]"
                ".map((f) => [f.id, f.said && f.said.text]))"
            )
            feed = page.evaluate(
                "[...document.querySelectorAll('#feed .feed-item')].map((n) =>"
                " [n.dataset.residentId, (n.querySelector('.reason') || n).textContent])"
            )
            for resident_id, text in feed:
                words = said[resident_id]
                assert words == "(stays put)" or text == f"“{words}”", (name, text, words)
            page.locator("#tab-latest").click()
            assert page.locator("#latest .latest-item").count() == 10
            _no_label_over_a_name(page, f"{name}, after a tick")
            _fits(page, f"the live page at {name} width")
        _shot(pages["phone"], "watch-phone-after-tick")

        # The admin's page of the run, on a phone: the nodes table and the charts fit.
        phone = pages["phone"]
        phone.goto(f"{web_server}/admin/town/run/{run.pk}/change/")
        phone.wait_for_function("document.querySelectorAll('.pk-charts canvas').length === 4")
        phone.wait_for_timeout(500)  # the charts drawn at their size
        _fits(phone, "the admin's run page at phone width")
        phone.screenshot(path=str(DOCS / "watch-admin-run-phone.png"), full_page=True)
        context.close()
