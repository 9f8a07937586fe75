"""/docs and /redoc work without internet: every script, stylesheet and icon their pages load
comes from this server, and with an API key they are behind it like every route but /health."""
from __future__ import annotations

from html.parser import HTMLParser

import pytest
from fastapi.testclient import TestClient
from http_fakes import fake_client


class Assets(HTMLParser):
    """Every src= and href= of a page."""

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


def make_client(**settings) -> TestClient:
    return fake_client(**settings)


@pytest.mark.parametrize("page, kinds", [("/docs", {"javascript", "css"}), ("/redoc", {"javascript"})])
def test_docs_pages_load_every_asset_from_this_server(page, kinds):
    with make_client() as c:
        r = c.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "://" not in r.text, f"{page} names an external URL"
        parser = Assets()
        parser.feed(r.text)
        assert parser.urls, f"{page} loads nothing"
        loaded = set()
        for url in parser.urls:
            assert url.startswith("/"), url
            asset = c.get(url)
            assert asset.status_code == 200 and asset.content, url
            loaded |= {kind for kind in ("javascript", "css") if kind in asset.headers["content-type"]}
        assert kinds <= loaded, f"{page} loaded {loaded}"
        # The schema the page renders is this server's too.
        assert "'/openapi.json'" in r.text or '"/openapi.json"' in r.text
        assert c.get("/openapi.json").status_code == 200


def test_docs_are_behind_the_api_key():
    with make_client(api_key="s3cret") as c:
        page = c.get("/docs")
        assert page.status_code == 401
        ok = {"authorization": "Bearer s3cret"}
        page = c.get("/docs", headers=ok)
        assert page.status_code == 200
        parser = Assets()
        parser.feed(page.text)
        script = next(url for url in parser.urls if url.endswith(".js"))
        assert c.get(script).status_code == 401
        assert c.get(script, headers=ok).status_code == 200
