"""The site's own pages around the town: the favicon, and the API docs (schema, Swagger UI,
Redoc) served from this site alone — no font, script, stylesheet or logo from another host."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
import yaml
from django.contrib.staticfiles import finders

pytestmark = pytest.mark.django_db

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


class _Resources(HTMLParser):
    """Every URL a page loads: src of any tag, href of <link>, and the CSP meta's content."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.csp = ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("src"):
            self.urls.append(attrs["src"])
        if tag == "link" and attrs.get("href"):
            self.urls.append(attrs["href"])
        if tag == "meta" and attrs.get("http-equiv", "").lower() == "content-security-policy":
            self.csp = attrs["content"]


def _resources(html: str) -> _Resources:
    parser = _Resources()
    parser.feed(html)
    return parser


def test_favicon_is_linked_from_every_page_and_answers_at_favicon_ico(client):
    assert finders.find("favicon.svg")
    home = _resources(client.get("/").content.decode())
    assert "/static/favicon.svg" in home.urls
    response = client.get("/favicon.ico")
    assert response.status_code == 302 and response["Location"] == "/static/favicon.svg"
    admin_login = _resources(client.get("/admin/login/").content.decode())
    assert "/static/favicon.svg" in admin_login.urls


@pytest.mark.parametrize("path", ["/api/docs/", "/api/redoc/"])
def test_docs_pages_load_nothing_from_another_host(client, path):
    response = client.get(path)
    assert response.status_code == 200
    html = response.content.decode()
    page = _resources(html)
    assert page.urls, html
    for url in page.urls:
        assert url.startswith("/") and not url.startswith("//"), f"{path} loads {url}"
    assert "/static/favicon.svg" in page.urls
    # Whatever the bundled scripts would fetch (Redoc's footer logo), the browser refuses.
    for directive in ("default-src 'self'", "img-src 'self'", "font-src 'self'"):
        assert directive in page.csp, page.csp
    assert not re.search(r"https?://", html), "an absolute URL in the page"
    assert "fonts.googleapis.com" not in html and "cdn." not in html


def test_swagger_asks_no_outside_validator(client):
    html = client.get("/api/docs/").content.decode()
    assert '"validatorUrl": null' in html


def test_schema_is_text_for_a_browser_and_openapi_for_clients(client):
    page = client.get("/api/schema/", HTTP_ACCEPT=BROWSER_ACCEPT)
    assert page.status_code == 200
    assert page["Content-Type"].startswith("text/plain")
    assert page["Content-Disposition"].startswith("inline")
    schema = yaml.safe_load(page.content)
    assert schema["info"]["title"] == "Pokomachi" and "/api/runs/" in schema["paths"]
    # API clients get what drf-spectacular always served them.
    default = client.get("/api/schema/")
    assert default["Content-Type"].startswith("application/vnd.oai.openapi")
    assert yaml.safe_load(default.content) == schema
    as_json = client.get("/api/schema/?format=json", HTTP_ACCEPT=BROWSER_ACCEPT)
    assert as_json["Content-Type"].startswith("application/vnd.oai.openapi+json")
    assert as_json.json() == schema
