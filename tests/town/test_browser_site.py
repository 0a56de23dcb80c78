"""The API docs in Debian's chromium: Redoc and Swagger UI render the schema and fetch nothing
from another host (fonts, logos, validator badges); the schema itself opens as text."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from tests.town.browser_fixtures import needs_chromium
from tests.town.live_fixtures import isolated_channel_layer  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium]


@pytest.mark.parametrize(
    ("path", "rendered"),
    [
        ("/api/redoc/", ".api-content h1"),
        ("/api/docs/", ".swagger-ui .opblock"),
    ],
)
def test_docs_render_from_this_site_alone(web_server, browser, path, rendered):
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    hosts: list[str] = []
    page.on("request", lambda request: hosts.append(urlsplit(request.url).netloc))
    page.goto(f"{web_server}{path}")
    page.wait_for_selector(rendered, timeout=30_000)  # (the pages' CSP refuses eval)
    page.wait_for_load_state("networkidle")
    here = urlsplit(web_server).netloc
    assert hosts and set(hosts) <= {here, ""}, hosts  # "": data: and blob: URLs


def test_schema_opens_as_text_in_the_browser(web_server, browser):
    page = browser.new_page()
    response = page.goto(f"{web_server}/api/schema/")  # a download would raise here
    assert response.headers["content-type"].startswith("text/plain")
    assert page.locator("body").inner_text().startswith("openapi: 3")
    page.goto(f"{web_server}/api/schema/?format=json")
    assert '"openapi": "3' in page.locator("body").inner_text()
