"""The dashboard's three files obey the rules the admin server and its users rely on,
checked without a browser: relative URLs only (SSH tunnels, notebook proxies, path
prefixes), nothing the Content-Security-Policy ``default-src 'self'`` forbids, nothing
loaded from elsewhere, and small enough to embed and load fast."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

STATIC = Path(__file__).resolve().parents[2] / "monarch_admin" / "static"
FILES = ("index.html", "app.js", "app.css")


def read(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", FILES)
def test_file_is_small(name: str) -> None:
    text = read(name)
    assert len(text.splitlines()) < 1000, f"{name} has grown past 1000 lines"
    assert len(text.encode()) < 64 * 1024, f"{name} is over 64 KiB"


@pytest.mark.parametrize("name", FILES)
def test_nothing_is_loaded_from_elsewhere(name: str) -> None:
    text = read(name)
    # SVG's namespace is an identifier, not a request.
    urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.\w+[^\s\"'`)]*", text))
    urls.discard("http://www.w3.org/2000/svg")
    assert not urls, f"{name} refers to other origins: {sorted(urls)}"


def test_the_page_uses_relative_urls_only() -> None:
    html = read("index.html")
    absolute = re.findall(r"""(?:src|href|action)\s*=\s*["']/""", html)
    assert not absolute, f"index.html has absolute paths: {absolute}"
    js = read("app.js")
    calls = re.findall(r"""(?:fetch|api|EventSource)\(\s*["'`]([^"'`]*)""", js)
    assert {"v1/summary", "v1/snapshot", "v1/events/stream"} <= set(calls), calls
    assert not [c for c in calls if c.startswith("/")], f"absolute URLs in app.js: {calls}"


def test_the_page_is_allowed_by_the_content_security_policy() -> None:
    html = read("index.html")
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "inline <script> in index.html"
    assert not re.search(r"<style\b|\sstyle=|\son\w+=", html), "inline style or handler in HTML"
    js = read("app.js")
    for banned in ("eval(", "new Function", "innerHTML", "outerHTML", "insertAdjacentHTML"):
        assert banned not in js, f"app.js uses {banned}"
    assert not re.search(r"setAttribute\(\s*[\"']style", js), "app.js sets a style attribute"
