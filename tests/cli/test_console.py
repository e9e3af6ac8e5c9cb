"""``idemkey console`` in a real headless browser (Debian's chromium, through Selenium) against
the session's real Redis, the console run as a user runs it (``python -m idemkey console``).

The page lists a record in flight (a guard() held open by this test) and an uncertain outcome
(a step, then a failure); once the held call completes, the page shows it completed without a
reload. With ``--allow-forget``, a record is forgotten from the page after the confirmation.
Through a DNS rebinding (a name of the attacker's resolved to 127.0.0.1) the browser gets no
page, no status, and its script forgets nothing.
Skipped, saying why, where chromium, chromedriver or Selenium is missing (.ci/run installs
them).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from idemkey import RedisStore, guard
from tests._servers import AppServer, wait_until
from tests.cli.conftest import EVIL, ROOT

pytestmark = pytest.mark.redis


def _text(driver: Any, css: str) -> str:
    """The text of the first element matching ``css``, or "" when there is none.

    The page swaps its sections in place on every refresh, so an element found a moment ago may
    be gone when its text is read (Selenium's StaleElementReferenceException): find it again.
    """
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + 10
    while True:
        try:
            found = driver.find_elements(By.CSS_SELECTOR, css)
            return str(found[0].text) if found else ""
        except StaleElementReferenceException:
            if time.monotonic() > deadline:
                raise


def _click(driver: Any, css: str) -> None:
    """Click the first element matching ``css`` once it is there, finding it again when a
    refresh replaced it between the find and the click (the click then never happened)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def click() -> bool:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        if not found:
            return False
        try:
            found[0].click()
        except StaleElementReferenceException:
            return False
        return True

    wait_until(click, 20, f"clicking {css}")


def test_the_console_shows_an_operation_in_flight_then_completed(
    browser: Any, console: Callable[..., AppServer], store: RedisStore
) -> None:
    with contextlib.suppress(RuntimeError), guard(store, "order-7", scope="acct") as call:
        call.step("reserve", lambda: 1)
        raise RuntimeError("card declined")  # an uncertain outcome: released with a step
    held = guard(store, "order-8", scope="acct", payload={"amount": 10})
    running = held.__enter__()
    try:
        running.step("charge", lambda: "ch_1")
        digest = held.record.digest
        server = console()
        browser.get(server.url + "/")
        browser.execute_script("window.notReloaded = true")
        row = f"#rec-{digest}"
        wait_until(lambda: "in_progress" in _text(browser, row), 20, "the record in flight")
        assert "charge" in _text(browser, row)
        assert "acct" in _text(browser, row)
        wait_until(
            lambda: "released_with_steps" in _text(browser, "#uncertain"), 20, "the uncertain entry"
        )
        assert "reserve" in _text(browser, "#uncertain")
        assert "compensate" in _text(browser, "#uncertain")

        running.save({"id": "ch_1"})
    finally:
        held.__exit__(None, None, None)  # completes: the result was saved
    wait_until(lambda: _text(browser, "#count-complete") == "1", 20, "the record completed")
    assert _text(browser, "#count-in_progress") == "0"
    assert _text(browser, row) == ""  # no longer in flight
    assert browser.execute_script("return window.notReloaded") is True  # refreshed in place
    # Nothing is sent anywhere but the console itself: its page loads only what it serves.
    with urllib.request.urlopen(server.url + "/") as answer:
        policy = answer.headers["Content-Security-Policy"]
        page = answer.read().decode()
    assert "connect-src 'self'" in policy
    assert "default-src 'none'" in policy
    assert "http" not in page.split("<body>", 1)[1].replace(server.url, "")
    with urllib.request.urlopen(server.url + "/api/status") as answer:
        view = json.loads(answer.read())
    assert view["counts"] == {"in_progress": 0, "lapsed": 0, "complete": 1, "released": 1}
    assert [e["kind"] for e in view["uncertain"]] == ["released_with_steps"]


def test_forget_from_the_page_needs_the_flag_and_a_confirmation(
    browser: Any, console: Callable[..., AppServer], store: RedisStore
) -> None:
    with contextlib.suppress(RuntimeError), guard(store, "order-9") as call:
        call.step("reserve", lambda: 1)
        raise RuntimeError("after a step")
    read_only = console()
    browser.get(read_only.url + "/")
    wait_until(lambda: "reserve" in _text(browser, "#stepped"), 20, "the released record")
    assert "forget" not in _text(browser, "#stepped")
    request = urllib.request.Request(
        read_only.url + "/api/forget", data=b'{"digest": "00"}', method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    assert refused.value.code == 403
    assert json.loads(refused.value.read())["detail"].startswith("forget is off")

    allowed = console("--allow-forget")
    browser.get(allowed.url + "/")
    _click(browser, "#stepped button[data-forget]")
    browser.switch_to.alert.dismiss()  # not confirmed: nothing deleted
    assert len(list(store.records())) == 1
    _click(browser, "#stepped button[data-forget]")
    alert = browser.switch_to.alert
    assert "run the work again" in alert.text
    alert.accept()
    wait_until(lambda: not list(store.records()), 20, "the record forgotten")
    wait_until(lambda: "forgot" in _text(browser, "#notice"), 20, "the page to say so")


# What a script of the attacker's page runs once evil.example resolves to 127.0.0.1: the
# console is then its own origin, so it reads the page (for a token), the status, and posts a
# forget with every header the page itself sends (the old constant confirmation header too).
_ATTACK = """
const done = arguments[arguments.length - 1];
(async () => {
  const page = await fetch("/");
  const html = await page.text();
  const found = html.match(/name="idemkey-token" content="([^"]+)"/);
  const status = await fetch("api/status");
  const forget = await fetch("api/forget", {
    method: "POST",
    headers: {"Content-Type": "application/json", "X-Idemkey-Confirm": "forget",
              "X-Idemkey-Token": found ? found[1] : "guess"},
    body: JSON.stringify({digest: arguments[0], state: "released", fence: arguments[1]}),
  });
  done({page: page.status, token: !!found, status: status.status,
        statusBody: await status.text(), forget: forget.status});
})().catch((error) => done({error: String(error)}));
"""


def test_a_rebinding_name_gets_no_status_and_its_script_forgets_nothing(
    rebinding_browser: Any, browser: Any, console: Callable[..., AppServer], store: RedisStore
) -> None:
    with contextlib.suppress(RuntimeError), guard(store, "order-11") as call:
        call.step("reserve", lambda: 1)
        raise RuntimeError("after a step")  # released with a step: the page offers to forget it
    (record,) = store.records()
    server = console("--allow-forget")
    # The console's own page, as the operator sees it: the record and its forget button.
    browser.get(server.url + "/")
    wait_until(lambda: "reserve" in _text(browser, "#stepped"), 20, "the operator's page")
    # The same server under the attacker's name: no page, no record in it.
    rebinding_browser.set_script_timeout(20)
    rebinding_browser.get(f"http://{EVIL}:{server.port}/")
    shown = rebinding_browser.page_source
    assert record.digest not in shown
    assert "reserve" not in shown
    assert "this console answers only to Host" in shown
    # A script of that origin: every read refused, the forget too; the record stays.
    fence = str(record.fence)  # what the page shows: the attacker's script reads it there
    seen = rebinding_browser.execute_async_script(_ATTACK, record.digest, fence)
    assert seen == {
        "page": 400, "token": False, "status": 400, "statusBody": seen.get("statusBody"),
        "forget": 400,
    }, seen  # fmt: skip
    assert record.digest not in seen["statusBody"]
    assert [s.digest for s in store.records()] == [record.digest]
    # The same script on the console's own page (its real origin) forgets: the refusals above
    # come from the name, not from a forget that never works.
    assert browser.execute_async_script(_ATTACK, record.digest, fence)["forget"] == 200
    assert list(store.records()) == []


def test_the_console_without_its_extra_is_one_line(redis_url: str, tmp_path: Path) -> None:
    code = (
        "import sys, builtins; real = builtins.__import__\n"
        "def no_jinja(name, *a, **k):\n"
        "    if name.startswith('jinja2'): raise ImportError('No module named jinja2')\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = no_jinja\n"
        "from idemkey.cli import main\n"
        f"sys.exit(main(['--redis-url', {redis_url!r}, 'console']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert result.returncode == 2
    assert "pip install 'idemkey-redis[console]'" in result.stderr
    assert result.stderr.count("\n") == 1
