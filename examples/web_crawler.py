"""A distributed web crawler: a mesh of crawler actors and one frontier actor that
hands out URLs and remembers which ones were seen.

The example serves a small web site itself, on loopback (``http.server`` in a thread
of the script): ``--pages`` generated pages that link to each other, with cycles,
repeated links, links to the same page with a ``#fragment``, one broken link and a few
links to other sites, which the crawlers must not follow. Then:

- ``Frontier`` (one actor, in a proc of its own) holds the queue of URLs to fetch and
  the set of URLs already queued (deduplication). Its ``take`` endpoint answers through
  an explicit response port: when the queue is empty but some crawler is still
  fetching (and may find new links), the request is parked and answered as soon as
  work arrives, or with ``None`` once the queue is empty *and* no page is in flight,
  which is the crawl's end. Nobody polls or sleeps.
- ``Crawler`` (a mesh of ``--crawlers`` actors, one per proc) loops: take a URL, fetch
  it, extract its links, keep those of the same site, report them to the frontier.

The client checks that any one crawler reaches the site (``choose``), starts every
crawler (``call``: a ``ValueMesh`` of per-crawler counts), prints what each fetched and
how long the crawl took, and checks that it found exactly the site's pages.

Run it with ``python examples/web_crawler.py`` (4 crawlers, 40 pages; a few seconds).
"""

from __future__ import annotations

import argparse
import random
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urldefrag, urljoin, urlsplit

from monarch.actor import Actor, Port, current_rank, endpoint, this_host

#: How long the client waits for any one call, in seconds.
TIMEOUT_S = 60.0


# The site ---------------------------------------------------------------------------


def make_site(pages: int, seed: int = 0) -> dict[str, str]:
    """The site's pages, path -> HTML. Every page is reachable from ``/``."""
    rng = random.Random(seed)
    paths = ["/"] + [f"/page/{i}.html" for i in range(1, pages)]
    site = {}
    for i, path in enumerate(paths):
        links = [
            paths[(i + 1) % pages],  # a ring through every page: cycles, all reachable
            paths[rng.randrange(pages)],
            paths[rng.randrange(pages)],
            "/",  # the same link on every page
            f"{path}#top",  # itself, with a fragment: the same URL
        ]
        if i % 10 == 3:
            links.append("https://example.com/elsewhere")  # another site: not followed
        if i % 10 == 7:
            links.append("mailto:webmaster@example.com")
        if i == pages // 2:
            links.append("/missing.html")  # a broken link: 404
        if i > 0:
            links.append(f"../page/{(i * 7) % pages or 1}.html")  # relative
        anchors = "".join(f'<li><a href="{href}">{href}</a></li>' for href in links)
        site[path] = f"<html><body><h1>Page {i}</h1><ul>{anchors}</ul></body></html>"
    return site


def serve(site: dict[str, str]) -> ThreadingHTTPServer:
    """Serve ``site`` on a free loopback port, from a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = site.get(urldefrag(self.path).url)
            if body is None:
                self.send_error(404)
                return
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="site", daemon=True).start()
    return server


# The actors -------------------------------------------------------------------------


@dataclass
class Stats:
    """What the frontier saw."""

    pages: list[str]  # the URLs fetched successfully, sorted
    errors: list[str]  # the URLs that failed (broken links)
    duplicates: int  # links dropped because their URL was already queued


class Frontier(Actor):
    """The shared queue of URLs to fetch, with the set of URLs ever queued."""

    def __init__(self, start: str) -> None:
        self.queue: deque[str] = deque([start])
        self.seen = {start}
        self.in_flight = 0  # URLs handed out and not yet reported
        self.waiting: list[Port[str | None]] = []  # crawlers waiting for work
        self.pages: list[str] = []
        self.errors: list[str] = []
        self.duplicates = 0

    @endpoint(explicit_response_port=True)
    def take(self, port: Port[str | None]) -> None:
        """A URL to fetch; ``None`` when the crawl is over. Answers later when there is
        no work right now but pages are still being fetched."""
        self.waiting.append(port)
        self._dispatch()

    @endpoint
    def report(self, url: str, links: list[str] | None) -> None:
        """``url`` was fetched and links to ``links`` (``None``: it failed)."""
        self.in_flight -= 1
        if links is None:
            self.errors.append(url)
        else:
            self.pages.append(url)
            for link in links:
                if link in self.seen:
                    self.duplicates += 1
                else:
                    self.seen.add(link)
                    self.queue.append(link)
        self._dispatch()

    def _dispatch(self) -> None:
        while self.waiting and self.queue:
            self.in_flight += 1
            self.waiting.pop(0).send(self.queue.popleft())
        if not self.queue and self.in_flight == 0:
            # Nothing queued and nobody fetching: nothing can add work any more.
            for port in self.waiting:
                port.send(None)
            self.waiting.clear()

    @endpoint
    def stats(self) -> Stats:
        return Stats(sorted(self.pages), sorted(self.errors), self.duplicates)


class LinkParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(value for name, value in attrs if name == "href" and value)


def same_site_links(url: str, html: str) -> list[str]:
    """The absolute URLs, without fragment, that ``html`` (served at ``url``) links to
    on the same site (scheme, host and port)."""
    parser = LinkParser()
    parser.feed(html)
    origin = urlsplit(url)[:2]
    links = []
    for href in parser.hrefs:
        absolute = urldefrag(urljoin(url, href)).url
        if urlsplit(absolute)[:2] == origin:
            links.append(absolute)
    return links


class Crawler(Actor):
    def __init__(self) -> None:
        self.rank = current_rank()["crawlers"]
        # Straight to the site: no proxy from the environment (``http_proxy``).
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @endpoint
    def probe(self, url: str) -> str:
        """Check that this crawler can reach ``url``."""
        with self.opener.open(url, timeout=10) as response:
            return f"crawler {self.rank} got {response.status} from {url}"

    @endpoint
    def crawl(self, frontier: Frontier) -> int:
        """Fetch URLs from the frontier until the crawl is over; how many were fetched."""
        fetched = 0
        while (url := frontier.take.call_one().get(timeout=TIMEOUT_S)) is not None:
            links: list[str] | None
            try:
                with self.opener.open(url, timeout=10) as response:
                    links = same_site_links(url, response.read().decode())
                fetched += 1
            except urllib.error.URLError:
                links = None
            # Report and move on: the frontier's replies keep their order per sender.
            frontier.report.broadcast(url, links)
        return fetched


# The client -------------------------------------------------------------------------


def crawl(num_crawlers: int, num_pages: int) -> Stats:
    site = make_site(num_pages)
    server = serve(site)
    root = f"http://127.0.0.1:{server.server_address[1]}/"
    frontier_procs = this_host().spawn_procs(per_host={"procs": 1})
    crawler_procs = this_host().spawn_procs(per_host={"crawlers": num_crawlers})
    try:
        frontier = frontier_procs.spawn("frontier", Frontier, root)
        crawlers = crawler_procs.spawn("crawlers", Crawler)
        print(f"serving {len(site)} pages at {root}")
        print(crawlers.probe.choose(root).get(timeout=TIMEOUT_S))

        started = time.monotonic()
        counts = crawlers.crawl.call(frontier).get(timeout=TIMEOUT_S)
        elapsed = time.monotonic() - started
        stats = frontier.stats.call_one().get(timeout=TIMEOUT_S)
        for point, count in counts.items():
            print(f"  crawler {point['crawlers']} fetched {count} pages")
        print(
            f"found {len(stats.pages)} pages in {elapsed:.2f} s with {num_crawlers} crawlers; "
            f"{stats.duplicates} duplicate links skipped, {len(stats.errors)} broken: "
            f"{', '.join(stats.errors)}"
        )
        expected = sorted(urljoin(root, path) for path in site)
        assert stats.pages == expected, f"crawled {stats.pages}, the site has {expected}"
        assert sum(counts.values()) == len(site)
        print("the crawl found exactly the site's pages")
        return stats
    finally:
        crawler_procs.stop().get(timeout=TIMEOUT_S)
        frontier_procs.stop().get(timeout=TIMEOUT_S)
        server.shutdown()
        server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crawlers", type=int, default=4)
    parser.add_argument("--pages", type=int, default=40)
    args = parser.parse_args()
    crawl(args.crawlers, args.pages)


if __name__ == "__main__":
    main()
