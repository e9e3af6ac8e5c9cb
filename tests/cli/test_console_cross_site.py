"""A page of another web site gets nothing from ``idemkey console``, reads included.

It needs no DNS rebinding to make the console work: ``<img src>``, ``<script src>`` or
``fetch(..., {mode: "no-cors"})`` pointed at ``http://127.0.0.1:8089/api/status`` carry the
console's own Host, and though that page cannot read the answer, each request was a full SCAN of
the prefix, as often as it liked. A browser says where a request comes from: ``Sec-Fetch-Site``
(``same-origin`` for the console's own page, ``none`` for an address typed or bookmarked) and,
on a cross-origin fetch, ``Origin``. The console refuses a read that one of them says comes
from elsewhere (403 problem), before any Redis call. Over HTTP with the headers Chromium sends,
and in headless Chromium with an attacker's page on another site.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from idemkey import RedisStore
from tests._servers import HOST, AppServer, ExternalRedis, RedisServer, wait_until
from tests.cli.conftest import EVIL
from tests.cli.test_console import _text
from tests.cli.test_console_guard import ask, own, released_with_a_step

pytestmark = pytest.mark.redis

#: What Chromium sends with each kind of request from a page of another site.
ELSEWHERE = [
    {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"},
    {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"},
    {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors"},  # another port: not ours
    {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors", "Origin": "https://evil.example"},
    {"Origin": "https://evil.example"},  # a browser without Sec-Fetch-*
    {"Origin": "null"},  # a sandboxed frame, a file:// page
]


def scans(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))


@pytest.mark.parametrize("path", ["/", "/fragment", "/api/status"])
def test_a_read_from_another_site_is_refused(
    console: Callable[..., AppServer], store: RedisStore, path: str
) -> None:
    digest = released_with_a_step(store, "order-31")
    server = console()
    for method in ("GET", "HEAD"):
        for headers in ELSEWHERE:
            status, body = ask(server, path, own(server), method=method, **headers)
            assert status == 403, (method, headers, body)
            assert digest not in body
            if method == "GET":
                problem = json.loads(body)
                assert problem["status"] == 403
                assert "another site" in problem["detail"]
    # Its own page, a typed address, a client that is no browser (curl): answered.
    home = f"http://{own(server)}"
    for headers in (
        {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"},
        {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"},
        {"Sec-Fetch-Site": "same-origin", "Origin": home},
        {"Origin": f"http://localhost:{server.port}"},
        {},
    ):
        status, body = ask(server, path, own(server), **headers)
        assert status == 200, (headers, body)
        assert digest in body


@contextlib.contextmanager
def attacker_site(page: str) -> Iterator[int]:
    """An HTTP server on a free port (the kernel's pick, bound at once) answering every GET with
    ``page``: another site's page."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    site = http.server.ThreadingHTTPServer((HOST, 0), Handler)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    try:
        yield site.server_address[1]
    finally:
        site.shutdown()
        site.server_close()


_ATTACKER = """<!doctype html><title>evil</title><p id="done"></p><script>
(async () => {
  const console = "http://127.0.0.1:%(port)d";
  const asked = [];
  for (let i = 0; i < 4; i++) {
    asked.push(fetch(console + "/api/status?n=" + i, {mode: "no-cors"}).catch(() => null));
    asked.push(new Promise((done) => {
      const image = new Image();
      image.onload = image.onerror = done;
      image.src = console + "/fragment?n=" + i;
    }));
  }
  await Promise.all(asked);
  document.getElementById("done").textContent = "sent " + asked.length;
})();
</script>"""


def test_a_page_of_another_site_makes_the_console_scan_nothing(
    rebinding_browser: Any,
    console: Callable[..., AppServer],
    store: RedisStore,
    real_client: redis.Redis,
    redis_server: RedisServer | ExternalRedis,
) -> None:
    if not isinstance(redis_server, RedisServer):
        pytest.skip("counts the server's SCAN calls: another client of a shared server scans")
    released_with_a_step(store, "order-32")
    server = console()
    with attacker_site(_ATTACKER % {"port": server.port}) as port:
        before = scans(real_client)
        rebinding_browser.get(f"http://{EVIL}:{port}/")
        wait_until(lambda: _text(rebinding_browser, "#done") == "sent 8", 20, "the requests")
        assert scans(real_client) == before  # not one SCAN of the prefix
    status, _ = ask(server, "/api/status", own(server))
    assert status == 200
    assert scans(real_client) > before  # the count does see a read
