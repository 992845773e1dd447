"""The web dashboard in a real (headless) browser, against the admin server over the
recorded job (tests/monitoring/fixtures/recorded.json): 2 hosts, 4 procs, the proc mesh
``trainer_procs`` and the actor mesh ``trainers``, whose rank 3 failed when its proc was
SIGKILLed.

Screenshots go to ``tmp_path``; with ``MONARCH_UPDATE_SCREENSHOTS=1`` they replace
``docs/images/dashboard-overview.png`` and ``docs/images/dashboard-actor.png`` (1400x900).
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from browser_helpers import WINDOW, Browser, PrefixProxy
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

pytestmark = pytest.mark.timeout(120)

DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
FAILED_ACTOR = "proc-11a1@unix:@/tmp/hyperactor-0/p4103/trainers[3]"
FAILED_CAUSE = "its process died (killed by signal 9, SIGKILL)"
BUSY_ACTOR = "proc-00a1@unix:@/tmp/hyperactor-0/p4100/trainers[0]"
SYSTEM_ACTOR = "proc-00a1@unix:@/tmp/hyperactor-0/p4100/mesh[0]"
PROC = "proc-00a1@unix:@/tmp/hyperactor-0/p4100"


def open_dashboard(browser: Browser, url: str) -> None:
    """Load the page and wait until the first snapshot is drawn."""
    browser.driver.get(url)
    browser.wait(
        "the first snapshot", lambda d: d.find_element(By.CSS_SELECTOR, "body[data-ready]")
    )
    browser.visible_testid("mesh-trainers")
    browser.wait(
        "the charts to be drawn",
        lambda d: len(d.find_elements(By.CSS_SELECTOR, '[data-testid="charts"] svg')) == 4,
    )


def assert_no_console_errors(browser: Browser) -> None:
    """No SEVERE console entry: no script error, no failed request of the page's own."""
    severe = browser.severe_console_entries()
    assert not severe, f"the console has errors: {severe}"


def screenshot(browser: Browser, name: str, tmp_path: Path) -> Path:
    browser.driver.execute_script("document.activeElement && document.activeElement.blur()")
    target = (
        DOCS_IMAGES if os.environ.get("MONARCH_UPDATE_SCREENSHOTS") == "1" else tmp_path
    ) / name
    target.parent.mkdir(parents=True, exist_ok=True)
    assert browser.driver.save_screenshot(str(target)), f"could not save {target}"
    print(f"screenshot: {target}")
    return target


def test_page_loads_without_console_errors(
    browser: Browser, dashboard_url: str, tmp_path: Path
) -> None:
    browser.prefer_dark()
    open_dashboard(browser, dashboard_url)
    dcl = browser.dom_content_loaded_ms()
    drawn = browser.first_render_ms()
    print(
        f"first load: domContentLoaded after {dcl:.1f} ms, first snapshot drawn at {drawn:.1f} ms"
    )
    # Loaded and drawn (both read above); how fast is for benches/monitoring_bench.py.
    assert dcl > 0 and drawn > 0, (dcl, drawn)
    # The header came from v1/summary.
    assert browser.by_testid("program").text == "train.py"
    assert browser.by_testid("health").text.lower() == "degraded"
    assert browser.by_testid("card-procs").text.split("\n")[1] == "4"
    size = browser.driver.execute_script("return [window.innerWidth, window.innerHeight]")
    assert tuple(size) == WINDOW, f"viewport is {size}, expected {WINDOW}"
    assert_no_console_errors(browser)
    screenshot(browser, "dashboard-overview.png", tmp_path)


def test_tree_shows_the_meshes_and_hides_system_actors(
    browser: Browser, dashboard_url: str
) -> None:
    open_dashboard(browser, dashboard_url)
    assert browser.by_testid("mesh-trainer_procs").is_displayed()
    assert "Trainer" in browser.by_testid("mesh-trainers").text
    tree = browser.by_testid("tree")
    assert tree.find_elements(By.CSS_SELECTOR, '[data-mesh="trainers"]')
    busy = browser.by_testid(f"actor-{BUSY_ACTOR}")
    assert "step" in busy.text, f"the busy actor shows no current endpoint: {busy.text!r}"
    # System actors are hidden until the toggle asks for them.
    assert not tree.find_elements(By.CSS_SELECTOR, f'[data-testid="actor-{SYSTEM_ACTOR}"]')
    browser.by_testid("toggle-system").click()
    browser.visible_testid(f"actor-{SYSTEM_ACTOR}")
    # A proc row shows pid, status, RSS and CPU.
    proc = browser.by_testid(f"proc-{PROC}").find_element(By.TAG_NAME, "summary").text
    for part in ("pid 4100", "running", "RSS", "CPU"):
        assert part in proc, f"{part!r} missing from the proc row {proc!r}"
    assert_no_console_errors(browser)


def test_failure_links_to_the_actor_detail(
    browser: Browser, dashboard_url: str, tmp_path: Path
) -> None:
    browser.prefer_dark()
    open_dashboard(browser, dashboard_url)
    failure = browser.visible_testid("failure")
    assert failure.get_attribute("data-actor") == FAILED_ACTOR
    assert "infrastructure" in failure.text
    assert "Trainer" in failure.text
    # By keyboard: the link takes the focus and Enter follows it.
    failure.find_element(By.CSS_SELECTOR, '[data-testid="failure-link"]').send_keys(Keys.ENTER)
    detail = browser.visible_testid("actor-detail")
    cause = browser.visible_testid("failure-cause")
    assert FAILED_CAUSE in cause.text
    assert "failed" in browser.by_testid("detail-status").text
    browser.wait(
        "the endpoint table",
        lambda _: "step" in browser.by_testid("endpoint-table").text,
    )
    row = browser.by_testid("endpoint-step").text
    assert row.split()[1] == "43", f"unexpected endpoint row {row!r}"
    assert "step" in browser.by_testid("detail-logs").text
    assert FAILED_ACTOR in detail.text
    screenshot(browser, "dashboard-actor.png", tmp_path)
    # Escape closes it.
    browser.driver.switch_to.active_element.send_keys(Keys.ESCAPE)
    browser.wait("the detail to close", lambda _: not detail.is_displayed())
    assert_no_console_errors(browser)


def test_log_search_finds_a_line(browser: Browser, dashboard_url: str) -> None:
    open_dashboard(browser, dashboard_url)
    query = browser.by_testid("log-query")
    query.clear()
    query.send_keys("LOSS 0.0250")
    browser.by_testid("log-search").click()

    def matched(_: Any) -> Any:
        lines = browser.by_testid("log-results").find_elements(
            By.CSS_SELECTOR, '[data-testid="log-line"]'
        )
        return lines if len(lines) == 1 else False

    (line,) = browser.wait("exactly one matching log line", matched)
    assert "step 39 loss 0.0250" in line.text
    assert line.find_element(By.TAG_NAME, "mark").text == "loss 0.0250"
    assert_no_console_errors(browser)


def test_stack_button_shows_the_text_or_a_readable_error(
    browser: Browser, dashboard_url: str
) -> None:
    open_dashboard(browser, dashboard_url)
    browser.by_testid(f"stack-{PROC}").click()
    panel = browser.visible_testid("stack-panel")

    def answered(_: Any) -> Any:
        found = panel.find_elements(
            By.CSS_SELECTOR, '[data-testid="stack-text"], [data-testid="stack-error"]'
        )
        return found[0] if found else False

    shown = browser.wait("the stack text or its error", answered)
    text = shown.text
    if shown.get_attribute("data-testid") == "stack-error":
        assert text.startswith("Could not get the stack: ")
        reason = text.removeprefix("Could not get the stack: ").strip()
        assert len(reason) > 10 and "[object" not in reason and "{" not in reason, text
    else:
        assert text.strip(), "the stack dump is empty"
    assert PROC in panel.text


def test_a_lost_cookie_shows_how_to_sign_in(browser: Browser, dashboard_url: str) -> None:
    if "token=" not in dashboard_url:
        pytest.skip("this server asks for no token")
    open_dashboard(browser, dashboard_url)
    # The access cookie is HttpOnly: only the browser can drop it, as when it expires.
    browser.driver.delete_all_cookies()
    banner = browser.visible_testid("banner", timeout=5.0)
    assert "?token=" in banner.text, banner.text
    assert browser.by_testid("connection").get_attribute("data-state") == "down"


def test_busy_actor_detail_estimates_percentiles(browser: Browser, dashboard_url: str) -> None:
    open_dashboard(browser, dashboard_url)
    browser.by_testid(f"actor-{BUSY_ACTOR}").click()
    browser.visible_testid("actor-detail")
    current = browser.wait(
        "the detail of the busy actor",
        lambda _: browser.by_testid("detail-current").text,
    )
    assert current == "step for 2.35 s", current
    # step: 10 calls <= 4096 us, 20 <= 8192 us, 10 <= 16384 us; linear within a bucket.
    cells = browser.by_testid("endpoint-step").find_elements(By.TAG_NAME, "td")
    name, count, errors, mean, p50, p99 = (c.text for c in cells[:6])
    assert (name, count, errors, mean) == ("step", "40", "0", "20.0 ms")
    assert (p50, p99) == ("6.14 ms", "16.1 ms")
    assert "null" not in browser.by_testid("actor-detail").text
    assert_no_console_errors(browser)


def test_the_page_works_behind_a_path_prefix(browser: Browser, dashboard_url: str) -> None:
    """As behind a notebook proxy: every request of the page, the event stream included,
    goes through the prefix."""
    parts = urllib.parse.urlsplit(dashboard_url)
    proxy = PrefixProxy(f"{parts.scheme}://{parts.netloc}/")
    try:
        open_dashboard(browser, proxy.url(parts.query))
        assert urllib.parse.urlsplit(browser.driver.current_url).path == proxy.prefix
        browser.wait(
            "the event stream through the proxy",
            lambda _: browser.by_testid("connection").get_attribute("data-state") == "live",
        )
        browser.by_testid("failure-link").click()
        assert FAILED_CAUSE in browser.visible_testid("failure-cause").text
        assert_no_console_errors(browser)
    finally:
        browser.close()  # before the proxy, which would wait for the open event stream
        proxy.close()


def test_a_stopped_server_shows_disconnected(browser: Browser, own_server: Any) -> None:
    open_dashboard(browser, own_server.url)
    browser.wait(
        "the live indicator",
        lambda _: browser.by_testid("connection").get_attribute("data-state") == "live",
    )
    own_server.stop()
    browser.wait(
        "the disconnected indicator",
        lambda _: browser.by_testid("connection").get_attribute("data-state") == "down",
    )
    assert "Cannot refresh" in browser.visible_testid("banner").text
    # What was on screen stays there to read.
    assert browser.by_testid("mesh-trainers").is_displayed()
