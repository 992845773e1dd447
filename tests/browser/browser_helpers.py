"""Helpers of the dashboard tests: find Debian's chromium and chromedriver, start a headless
browser that leaves no process or profile behind, and small bounded waits.

Install the browser with ``tests/browser/install_chromium.sh`` (as root) and the client
with ``pip install selenium``. Without them the tests skip, unless
``MONARCH_REQUIRE_BROWSER=1`` (CI), which makes them fail instead.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Where Debian's packages put the browser and its driver; PATH is searched as well.
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
CHROMEDRIVER_NAMES = ("chromedriver",)
#: The size of the window, and so of the screenshots.
WINDOW = (1400, 900)
#: Every wait of the tests is bounded by this many seconds.
WAIT_S = 10.0


def require_browser() -> bool:
    """Whether a missing browser is a failure (CI) rather than a reason to skip."""
    return os.environ.get("MONARCH_REQUIRE_BROWSER", "") == "1"


def _which(names: tuple[str, ...]) -> str | None:
    for name in names:
        found = shutil.which(name) or (
            f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None
        )
        if found:
            return found
    return None


@dataclass(frozen=True)
class BrowserPaths:
    chromium: str
    chromedriver: str


def find_browser() -> BrowserPaths | str:
    """The browser and driver to use, or why the tests cannot run."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed (.venv/bin/pip install selenium)"
    chromium = _which(CHROMIUM_NAMES)
    driver = _which(CHROMEDRIVER_NAMES)
    if chromium is None or driver is None:
        missing = " and ".join(
            n for n, p in (("chromium", chromium), ("chromedriver", driver)) if p is None
        )
        return f"{missing} not found; run tests/browser/install_chromium.sh as root"
    return BrowserPaths(chromium=chromium, chromedriver=driver)


class Browser:
    """A headless chromium driven by Selenium, with a private profile directory.

    ``close()`` quits the browser, stops the driver process and removes the profile; it
    is safe to call twice.
    """

    #: How many times a launch is tried: chromium sometimes exits while it starts
    #: ("session not created: Chrome instance exited"), a fault of the browser's start,
    #: not of the page under test.
    LAUNCH_TRIES = 3

    def __init__(self, paths: BrowserPaths) -> None:
        from selenium.common.exceptions import SessionNotCreatedException

        for attempt in range(1, self.LAUNCH_TRIES + 1):
            try:
                self._launch(paths)
                return
            except BaseException as e:
                tail = self._log_tail()
                if os.path.exists(self.log):
                    os.unlink(self.log)
                if not isinstance(e, SessionNotCreatedException):
                    raise
                if attempt == self.LAUNCH_TRIES:
                    raise AssertionError(
                        f"chromium did not start in {self.LAUNCH_TRIES} tries; the last "
                        f"driver log:\n{tail}"
                    ) from e
                print(f"chromium did not start (try {attempt}): {e.msg}", file=sys.stderr)

    def _log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no driver log)"

    def _launch(self, paths: BrowserPaths) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.profile = tempfile.mkdtemp(prefix="monarch-chromium-")
        fd, self.log = tempfile.mkstemp(prefix="monarch-chromedriver-", suffix=".log")
        os.close(fd)
        options = webdriver.ChromeOptions()
        options.binary_location = paths.chromium
        for arg in (
            "--headless=new",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-breakpad",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            f"--user-data-dir={self.profile}",
        ):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.service = Service(
            executable_path=paths.chromedriver, service_args=["--verbose"], log_output=self.log
        )
        try:
            self.driver = webdriver.Chrome(service=self.service, options=options)
        except BaseException:
            self.service.stop()
            shutil.rmtree(self.profile, ignore_errors=True)
            raise
        # --window-size is the outer size: fix the viewport itself, for the screenshots.
        self.driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": WINDOW[0], "height": WINDOW[1], "deviceScaleFactor": 1, "mobile": False},
        )
        self.driver.set_page_load_timeout(WAIT_S)
        self.driver.set_script_timeout(WAIT_S)
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.driver.quit()
        finally:
            self.service.stop()
            shutil.rmtree(self.profile, ignore_errors=True)
            if os.path.exists(self.log):
                os.unlink(self.log)

    # ---- conveniences used by the tests ------------------------------------------------

    def wait(self, what: str, condition: Callable[[Any], Any], timeout: float = WAIT_S) -> Any:
        """Wait (bounded) until ``condition(driver)`` is truthy; fail saying ``what``."""
        from selenium.common.exceptions import (
            NoSuchElementException,
            StaleElementReferenceException,
        )
        from selenium.webdriver.support.ui import WebDriverWait

        # The page redraws parts of itself on each refresh: an element found a moment ago
        # may be gone, and is then looked up again.
        ignored = (NoSuchElementException, StaleElementReferenceException)
        return WebDriverWait(self.driver, timeout, ignored_exceptions=ignored).until(
            condition, message=f"timed out after {timeout:g} s waiting for {what}"
        )

    def by_testid(self, testid: str) -> Any:
        """The first element with this ``data-testid`` (ids contain ``[`` ``]`` ``"``-free)."""
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, f'[data-testid="{css_string(testid)}"]')

    def visible_testid(self, testid: str, timeout: float = WAIT_S) -> Any:
        """Wait until an element with this ``data-testid`` is displayed, and return it."""

        def shown(_: Any) -> Any:
            el = self.by_testid(testid)
            return el if el.is_displayed() else False

        return self.wait(f'[data-testid="{testid}"] to show', shown, timeout)

    def severe_console_entries(self) -> list[dict[str, Any]]:
        """The browser console's SEVERE entries since the last call."""
        entries: list[dict[str, Any]] = self.driver.get_log("browser")  # type: ignore[no-untyped-call]
        return [e for e in entries if e.get("level") == "SEVERE"]

    def dom_content_loaded_ms(self) -> float:
        """Navigation timing of the current page: ``domContentLoadedEventEnd`` in ms."""
        value = self.driver.execute_script(
            "const n = performance.getEntriesByType('navigation')[0];"
            "return n ? n.domContentLoadedEventEnd : null;"
        )
        assert value is not None, "the browser reports no navigation timing"
        return float(value)

    def first_render_ms(self) -> float:
        """When the page drew its first snapshot (its ``monarch:first-render`` mark), in ms."""
        value = self.driver.execute_script(
            "const m = performance.getEntriesByName('monarch:first-render')[0];"
            "return m ? m.startTime : null;"
        )
        assert value is not None, "the page has not drawn a snapshot"
        return float(value)

    def prefer_dark(self, dark: bool = True) -> None:
        """Emulate ``prefers-color-scheme`` (headless chromium defaults to light)."""
        self.driver.execute_cdp_cmd(
            "Emulation.setEmulatedMedia",
            {"features": [{"name": "prefers-color-scheme", "value": "dark" if dark else "light"}]},
        )


def css_string(text: str) -> str:
    """Escape ``text`` for a double-quoted CSS string."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


class PrefixProxy:
    """A reverse proxy that serves ``upstream`` under a path prefix, as notebook proxies
    do (``http://127.0.0.1:PORT/proxy/admin/...`` -> ``upstream/...``): it rewrites the
    ``Host`` header and ``Location`` redirects, and streams the answers (event streams
    included). For checking that the page uses relative URLs only."""

    def __init__(self, upstream: str, prefix: str = "/proxy/admin/") -> None:
        import http.client
        import threading
        import urllib.parse
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        target = urllib.parse.urlsplit(upstream)
        host, port = target.hostname or "127.0.0.1", target.port or 80
        self.prefix = prefix

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if not self.path.startswith(prefix):
                    self.send_error(404, f"outside the proxied prefix {prefix}")
                    return
                skip = {"host", "origin", "connection", "accept-encoding"}
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                conn = http.client.HTTPConnection(host, port, timeout=WAIT_S * 3)
                try:
                    conn.request("GET", "/" + self.path[len(prefix) :], headers=headers)
                    answer = conn.getresponse()
                    self.send_response(answer.status)
                    for key, value in answer.getheaders():
                        if key.lower() in ("connection", "transfer-encoding", "keep-alive"):
                            continue
                        if key.lower() == "location" and value.startswith("/"):
                            value = prefix + value[1:]
                        self.send_header(key, value)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    while chunk := answer.read1(65536):
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except OSError:
                    pass  # the browser or the server went away
                finally:
                    conn.close()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="prefix-proxy", daemon=True
        )
        self.thread.start()

    def url(self, query: str = "") -> str:
        port = self.server.server_address[1]
        return f"http://127.0.0.1:{port}{self.prefix}" + (f"?{query}" if query else "")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(WAIT_S)
