"""The post-mortem report: one self-contained HTML file of the recorded job's last
state, the failures and their causes first, everything escaped, nothing fetched."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from tui_helpers import recorded

from monarch._src.monitoring.report import render_report, write_report

pytestmark = pytest.mark.timeout(30)

FAILED_PROC = "proc-11a1@unix:@/tmp/hyperactor-0/p4103"


class _Tags(HTMLParser):
    """Every start tag with its attributes, and whether the tags balance."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))
        if tag not in ("meta", "br"):
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, (tag, self.open[-5:])
        self.open.pop()


def _write(tmp_path: Path, data: dict[str, Any]) -> str:
    path = tmp_path / "report.html"
    write_report(path, data["summary"], data["snapshot"], data["events"], data["logs"])
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]  # no temporary left
    return path.read_text(encoding="utf-8")


def test_the_report_of_the_recorded_job(tmp_path: Path) -> None:
    text = _write(tmp_path, recorded())
    assert text.startswith("<!DOCTYPE html>")
    assert "<title>monarch report: train.py</title>" in text
    assert 'health <span class="s warn">degraded</span>' in text
    # The failures come first, with their cause chains.
    failures = text.index("<h2>Failures</h2>")
    assert failures < text.index("<h2>Hosts, procs and actors</h2>") < text.index("<h2>Events")
    cause = "trainers rank 3 failed: its process died (killed by signal 9, SIGKILL)"
    assert f'<ol class="cause"><li>{cause}</li></ol>' in text
    assert text.index(cause) > failures
    assert "killed by signal 9 (SIGKILL)" in text
    # The tree with statuses, the events, the failed proc's logs, the counters.
    assert 'trainers[3] Trainer <span class="s bad">failed</span>' in text
    assert "actor mesh trainers (Trainer) spawned on trainer_procs" in text
    assert "proc rank 3 (pid 4103): the last 10 lines" in text
    assert "step 39 loss 0.0250" in text and "step 38 loss" not in text  # rank 2's
    assert "step 40 mean 20.00 ms" in text
    tags = _Tags()
    tags.feed(text)
    tags.close()
    assert tags.open == []


def test_the_report_escapes_and_fetches_nothing(tmp_path: Path) -> None:
    data = recorded()
    evil = '<script>alert("x")</script> & <img src=x onerror=alert(1)>'
    data["logs"].append(
        {"time": 1764200999.0, "proc": FAILED_PROC, "rank": 3, "stream": "stderr", "line": evil}
    )
    data["summary"]["program"] = "<b>train</b>.py"
    data["snapshot"]["actors"][-2]["failure"]["cause"].append("</ol><script>x</script>")
    text = _write(tmp_path, data)
    assert "<script" not in text.lower() and "<img" not in text.lower()
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;img" in text
    assert "&lt;b&gt;train&lt;/b&gt;.py" in text
    tags = _Tags()
    tags.feed(text)
    tags.close()
    # Nothing is fetched: no script, no link, no image, no URL of any kind.
    names = {tag for tag, _ in tags.tags}
    assert not names & {"script", "link", "img", "iframe", "object", "embed", "a", "base"}
    attrs = {name for _, pairs in tags.tags for name, _ in pairs}
    assert not attrs & {"src", "href", "action", "srcset"} and not any(
        a.startswith("on") for a in attrs
    )
    assert not re.search(r"https?://|url\(|@import|//[a-z]", text, re.IGNORECASE)


def test_the_report_of_nothing(tmp_path: Path) -> None:
    text = render_report(None, None)
    assert "No failures." in text and "No events." in text and "No actors." in text
    path = tmp_path / "empty.html"
    write_report(str(path), {}, {}, [], [])
    assert "health" in path.read_text()
    with pytest.raises(FileNotFoundError):
        write_report(tmp_path / "missing" / "r.html", {}, {}, [], [])
