"""The README's town-view screenshots, from a stored run's replay, in Debian's chromium.

    POKOMACHI_VAR_DIR=... .venv/bin/python -m daphne -p 8765 pokosite.asgi:application &
    .venv/bin/python docs/replay_screenshots.py --run 8 --tick 7 [--url http://127.0.0.1:8765]

Writes docs/town-view.png (1280x800) and docs/town-view-phone.png (390x844): the town as that
tick began, every resident's words of the tick before as bubbles.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from playwright.sync_api import sync_playwright

DOCS = Path(__file__).resolve().parent
SIZES = {"town-view": (1280, 800), "town-view-phone": (390, 844)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=int, required=True)
    parser.add_argument("--tick", type=int, required=True, help="the replay's frame")
    parser.add_argument("--url", default="http://127.0.0.1:8765")
    args = parser.parse_args()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        for name, (width, height) in SIZES.items():
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(f"{args.url}/runs/{args.run}/replay/")
            page.wait_for_function("window.townReplay && townReplay.data", timeout=30_000)
            page.evaluate(
                f"townReplay.map.bubbleMs = Infinity; townReplay.show({args.tick}, false)"
            )
            page.wait_for_timeout(1500)  # the figures settle
            page.screenshot(path=str(DOCS / f"{name}.png"))
            print(f"docs/{name}.png: run {args.run}, tick {args.tick}")
        browser.close()


if __name__ == "__main__":
    main()
