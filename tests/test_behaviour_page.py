"""docs/behaviour.md runs as printed: its Stripe-shaped error renderer and its Redis client.

The client block's settings are the page's promise: against a real redis-server whose port
refuses connections (stopped), a guarded request answers 503 at once; against one that
accepts and never answers (paused with SIGSTOP), after about a second. With redis-py 8.1's
default client the refused case takes ~8 s and the paused one hangs, so a sample that lost
its settings fails here.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from flask import Flask

from idemkey import RedisStore
from idemkey.adapters.flask import Idemkey
from tests._pages import run_page
from tests._servers import RedisServer

HEADERS = {"Idempotency-Key": "k-1", "Authorization": "Bearer test"}


def charges(store: RedisStore) -> Flask:
    app = Flask(__name__)
    idem = Idemkey(app, store=store)

    @app.post("/charges")
    @idem.idempotent
    def create_charge() -> Any:
        return {"id": "ch_1"}, 201

    return app


def timed_post(app: Flask, bound: float, unblock: Any) -> tuple[Any, float]:
    """The POST's response and its duration; fails if it has not answered within ``bound``
    seconds (``unblock()`` then frees it, so no thread is left behind)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        outcome["response"] = app.test_client().post("/charges", json={"a": 1}, headers=HEADERS)
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound)
    if thread.is_alive():
        unblock()
        thread.join(10)
        pytest.fail(f"no answer within {bound:g} s")
    return outcome["response"], outcome["seconds"]


@pytest.mark.redis
def test_stripe_errors_and_the_client_run_as_printed(private_redis_server: RedisServer) -> None:
    answers, sdks, stripe, client = run_page("docs/behaviour.md", private_redis_server.url)
    # The generated-SDK section's policy: waits, and marks the retryable problems.
    assert (sdks["policy"].wait, sdks["policy"].mark_retryable) == (5.0, True)
    store = RedisStore(client["client"], stripe["policy"])  # the page's client, its policy
    app = charges(store).test_client()
    try:
        first = app.post("/charges", json={"amount": 1}, headers=HEADERS)
        reused = app.post("/charges", json={"amount": 2}, headers=HEADERS)
    finally:
        store.close()
        client["client"].close()
    assert first.status_code == 201, first.get_data(as_text=True)
    assert reused.status_code == 400  # mismatch_status=400, as Stripe answers
    assert reused.content_type == "application/json"
    error = reused.get_json()["error"]
    assert (error["type"], error["code"]) == ("idempotency_error", "key_reused")
    # The page's answers policy: the marker and the retention header on the first answer,
    # a refusal that says what to do next.
    store = RedisStore(
        client["client"].__class__.from_url(private_redis_server.url), answers["policy"]
    )
    app = charges(store).test_client()
    try:
        first = app.post("/charges", json={"amount": 1}, headers=HEADERS)
        again = app.post("/charges", json={"amount": 1}, headers=HEADERS)
        reused = app.post("/charges", json={"amount": 2}, headers=HEADERS)
    finally:
        store.close()
        store.client.close()
    assert first.headers["Idempotent-Replayed"] == "false"
    assert first.headers["Idempotency-Retention"] == "86400"
    assert again.headers["Idempotent-Replayed"] == "true"
    assert reused.status_code == 422
    assert (reused.get_json()["retry"], reused.get_json()["retention"]) == ("new_key", 86400)


@pytest.mark.redis
def test_the_page_client_gets_503_at_once_when_redis_refuses(
    private_redis_server: RedisServer,
) -> None:
    server = private_redis_server
    *_, client = run_page("docs/behaviour.md", server.url)
    server.stop()  # its port now refuses connections
    app = charges(client["store"])
    try:
        response, seconds = timed_post(app, 30.0, lambda: None)
    finally:
        client["store"].close()
        client["client"].close()
    assert response.status_code == 503, response.get_data(as_text=True)
    assert response.get_json()["code"] == "store_unavailable"
    assert seconds < 0.5  # the page: "at once" (measured 1-12 ms; the default client: ~8 s)


@pytest.mark.redis
def test_the_page_client_gets_503_in_about_a_second_when_redis_hangs(
    private_redis_server: RedisServer,
) -> None:
    server = private_redis_server
    *_, client = run_page("docs/behaviour.md", server.url)
    server.pause()  # accepts connections, never answers
    app = charges(client["store"])
    try:
        response, seconds = timed_post(app, 5.0, server.resume)
    finally:
        if server.paused:
            server.resume()
        client["store"].close()
        client["client"].close()
    assert response.status_code == 503, response.get_data(as_text=True)
    assert 0.9 < seconds < 3.0  # two reads of 0.5 s (the page: "about a second")


def test_the_retry_story_shows_the_header_lines_the_demo_sends_in_their_order() -> None:
    """The page's "real output" of `idemkey serve`: the same request twice, then another body
    and no key, through the demo app the command serves; the header lines each answer shows
    are the app's, in the app's order (a replay keeps the first answer's order)."""
    import re
    from pathlib import Path

    from idemkey.cli.demo_app import demo_policy
    from idemkey.cli.demo_app.flask_app import create_app
    from idemkey.testing import fake_store

    page = (Path(__file__).parent.parent / "docs" / "behaviour.md").read_text("utf-8")
    console = re.search(r"## The retry story over HTTP.*?```console\n(.*?)```", page, re.S)
    assert console is not None
    shown = [
        [line.split(":")[0] for line in answer.splitlines() if re.match(r"[A-Z][\w-]*: ", line)]
        for answer in re.split(r"\n\$ ", console[1])
    ]
    app = create_app(fake_store(demo_policy()))
    client = app.test_client()
    headers = {"Idempotency-Key": "order-1001", "Account": "acct_demo"}
    charge = {"amount": 1000, "currency": "eur"}
    answers = [
        client.post("/charges", json=charge, headers=headers),
        client.post("/charges", json=charge, headers=headers),
        client.post("/charges", json={**charge, "amount": 2000}, headers=headers),
        client.post("/charges", json=charge, headers={"Account": "acct_demo"}),
    ]
    sent = [[name for name, _ in answer.headers] for answer in answers]
    assert [answer.status_code for answer in answers] == [201, 201, 422, 400]
    for page_names, names in zip(shown, sent, strict=True):
        assert page_names == [name for name in names if name in page_names], (page_names, names)
