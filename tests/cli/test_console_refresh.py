"""The page of ``idemkey console`` has at most one refresh in flight, in headless Chromium.

Each refresh is a SCAN of the whole prefix. Started by a timer whatever the last one was doing,
refreshes slower than ``--refresh`` (a large keyspace, a distant Redis) piled up: one open tab
kept several scans running at once, and queued more. The page's own script is run as served;
its ``fetch`` is wrapped in the browser to answer slowly (three refresh intervals) and to count
what is in flight, as a slow server would be seen from the page.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests._servers import AppServer, wait_until

pytestmark = pytest.mark.redis

# Every fetch the page makes from now on answers `delay` ms late, the first `failures` of them
# fail (a console that does not answer); window.seen counts them.
_SLOW_FETCH = """
const [delay, failures] = arguments;
const real = window.fetch.bind(window);
window.seen = {inFlight: 0, most: 0, done: 0, failed: 0};
window.fetch = async (...args) => {
  const seen = window.seen;
  seen.inFlight += 1;
  seen.most = Math.max(seen.most, seen.inFlight);
  try {
    const answer = await real(...args);
    await new Promise((done) => setTimeout(done, delay));
    if (seen.failed < failures) {
      seen.failed += 1;
      throw new TypeError("Failed to fetch");
    }
    return answer;
  } finally {
    seen.inFlight -= 1;
    seen.done += 1;
  }
};
"""


def test_a_refresh_slower_than_the_interval_is_not_joined_by_another(
    browser: Any, console: Callable[..., AppServer]
) -> None:
    server = console()  # --refresh 0.5
    browser.get(server.url + "/")
    browser.execute_script(_SLOW_FETCH, 1500, 2)  # each refresh takes three intervals
    wait_until(lambda: browser.execute_script("return window.seen.done") >= 4, 30, "four refreshes")
    seen = browser.execute_script("return window.seen")
    assert seen["most"] == 1, seen
    assert seen["failed"] == 2  # and refreshing went on after the failures
    assert "updated" in browser.execute_script(
        "return document.getElementById('status').textContent"
    )
