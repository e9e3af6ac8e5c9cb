"""A forget from ``idemkey console`` deletes the record the page showed, nothing else.

The page draws a forget button only on a lapsed record and on a released one with finished
steps, and sends back the state and fence it drew the button with; forget.lua compares them
with the record in the script that deletes it. So a retry that took a lapsed record over and
completed it while the operator's ``confirm()`` was open keeps its stored answer (409, and the
next retry replays instead of running the work again), and the console forgets no completed
record, which it never offers. ``store.forget()`` without what was shown (``idemkey forget``)
is unchanged. Run as a user runs it (``python -m idemkey console``) against the session's real
Redis, over HTTP and in headless Chromium.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from idemkey import RedisStore
from idemkey._codec import StoredResponse, encode_response
from idemkey._core import Claimed, Record, record_for
from idemkey._core._origin import record_origin
from tests._servers import AppServer, wait_until
from tests.cli.test_console import _click, _text
from tests.cli.test_console_guard import ask, own, token_of

pytestmark = pytest.mark.redis

STORED = encode_response(StoredResponse(201, (), b'{"id": "ch_1"}'))


def lapsed(store: RedisStore, key: str) -> Record:
    """A record whose owner stopped renewing: its lease passed, as after a crash."""
    record = record_for(store.policy.prefix, "acct_1", "POST", "/charges", key)
    origin = record_origin("acct_1", "POST", "/charges", key)
    store.claim(record, "fp", lease_ms=100, heartbeat=False, origin=origin)
    wait_until(lambda: _state(store, record) == "lapsed", 10, "the lease to pass")
    return record


def _state(store: RedisStore, record: Record) -> str:
    status = store.record(record)
    return status.state if status is not None else ""


def take_over(store: RedisStore, record: Record, *, complete: bool) -> int:
    """The client's retry: it takes the lapsed record over, and completes it or lapses too."""
    claimed = store.claim(record, "fp", lease_ms=100, heartbeat=False)
    assert isinstance(claimed, Claimed), claimed
    assert claimed.takeover
    if complete:
        assert store.complete(record, claimed.owner, STORED)
    else:
        wait_until(lambda: _state(store, record) == "lapsed", 10, "the retry to lapse too")
    return claimed.fence


def shown_button(server: AppServer, record: Record) -> tuple[str, str]:
    """The state and fence the page's forget button for ``record`` carries."""
    status, page = ask(server, "/", own(server))
    assert status == 200
    found = re.search(
        rf'<button data-forget="{record.digest}" data-state="(\w+)" data-fence="(\d*)">', page
    )
    assert found, "no forget button for the record"
    return found[1], found[2]


def forget(server: AppServer, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    headers = {"Origin": f"http://{own(server)}", "X-Idemkey-Token": token_of(server)}
    status, answer = ask(server, "/api/forget", own(server), method="POST", body=body, **headers)
    return status, json.loads(answer)


def test_a_record_a_retry_completed_after_the_page_showed_it_lapsed_is_kept(
    console: Callable[..., AppServer], store: RedisStore
) -> None:
    record = lapsed(store, "inv-1")
    server = console("--allow-forget")
    state, fence = shown_button(server, record)
    assert state == "lapsed"
    # While the operator's confirm() is open, the client's retry takes it over and completes.
    take_over(store, record, complete=True)
    status, problem = forget(server, {"digest": record.digest, "state": state, "fence": fence})
    assert status == 409, problem
    assert problem["status"] == 409
    assert problem["type"] == "about:blank"
    assert "complete" in problem["detail"]
    assert _state(store, record) == "complete"  # its stored answer is still replayed


def test_a_record_taken_over_and_lapsed_again_is_kept_until_the_page_shows_its_new_fence(
    console: Callable[..., AppServer], store: RedisStore
) -> None:
    record = lapsed(store, "inv-2")
    server = console("--allow-forget")
    state, fence = shown_button(server, record)
    new_fence = take_over(store, record, complete=False)  # the same state, another claim
    assert str(new_fence) != fence
    status, problem = forget(server, {"digest": record.digest, "state": state, "fence": fence})
    assert status == 409, problem
    assert _state(store, record) == "lapsed"
    assert shown_button(server, record) == ("lapsed", str(new_fence))
    status, answer = forget(
        server, {"digest": record.digest, "state": "lapsed", "fence": new_fence}
    )
    assert status == 200, answer
    assert answer["state"] == "lapsed"
    assert _state(store, record) == ""


@pytest.mark.parametrize(
    "body",
    [
        {"state": "complete", "fence": ""},  # never offered: the page has no such button
        {"state": "in_progress", "fence": "1"},
        {},  # what the page showed is not said
        {"state": "lapsed"},
        {"state": "lapsed", "fence": "x1"},
        {"state": "lapsed", "fence": 1.5},
        {"state": "lapsed", "fence": "9" * 40},
    ],
)
def test_the_console_forgets_only_what_its_page_offers(
    console: Callable[..., AppServer], store: RedisStore, body: dict[str, Any]
) -> None:
    record = lapsed(store, "inv-3")
    take_over(store, record, complete=True)
    server = console("--allow-forget")
    status, problem = forget(server, {"digest": record.digest, **body})
    assert status == 400, problem
    assert problem["status"] == 400
    assert _state(store, record) == "complete"


def test_store_forget_without_what_was_shown_is_unchanged(store: RedisStore) -> None:
    """``idemkey forget`` (documented): a completed record is deleted; with ``seen`` it is
    kept when it is no longer what was seen, and nothing is written."""
    record = lapsed(store, "inv-4")
    fence = take_over(store, record, complete=True)
    kept = store.forget(record, seen=("lapsed", fence))
    assert (kept.changed, kept.forgotten, kept.state, kept.deleted) == (True, False, "complete", 0)
    assert _state(store, record) == "complete"
    gone = store.forget(record)
    assert (gone.changed, gone.forgotten, gone.state) == (False, True, "complete")
    assert _state(store, record) == ""
    nothing = store.forget(record, seen=("lapsed", fence))
    assert (nothing.changed, nothing.forgotten, nothing.state) == (True, False, "")


def test_confirming_after_a_retry_completed_the_record_forgets_nothing_in_the_browser(
    browser: Any, console: Callable[..., AppServer], store: RedisStore
) -> None:
    record = lapsed(store, "inv-5")
    server = console("--allow-forget")
    browser.get(server.url + "/")
    button = f'#rec-{record.digest} button[data-forget][data-state="lapsed"]'
    _click(browser, button)
    alert = browser.switch_to.alert  # the page's script waits in confirm() meanwhile
    assert "lapsed" in alert.text
    take_over(store, record, complete=True)
    alert.accept()
    wait_until(lambda: "not forgotten" in _text(browser, "#notice"), 20, "the refusal shown")
    assert "complete" in _text(browser, "#notice")
    assert _state(store, record) == "complete"
