"""One reporter for the HTTP exchange and the guards: the events and uncertain entries each
reports name its record, scope, method and route the same way (idemkey.events.Reporter)."""

from __future__ import annotations

import hashlib
from typing import Any

from idemkey import Event, Policy
from idemkey._core import record_for
from idemkey.events import Reporter, Reporting, report
from idemkey.guard._sync_guard import Guard
from idemkey.http import Exchange, Headers, Request, begin
from idemkey.testing import fake_store


def digest(scope: str) -> str:
    return hashlib.blake2b(scope.encode(), digest_size=6).hexdigest()


def test_a_reporter_names_its_source_in_events_and_uncertain_entries() -> None:
    events: list[Event] = []
    kept: list[tuple[Any, ...]] = []
    record = record_for("idemkey", "tenant", "POST", "/charges/{id}", "k1")
    reporter = Reporter(events.append, record, "tenant", "POST", "/charges/{id}")
    reporter.keep = lambda *entry: kept.append(entry)
    reporter.notify("claimed", 3, seconds=0.5)
    reporter.uncertain("takeover", 3, "why", ("charge",))
    assert events == [
        Event("claimed", record.digest, "/charges/{id}", "POST", digest("tenant"), 3, 0.5)
    ]
    assert kept == [("takeover", reporter, 3, "why", ("charge",))]
    # report(), a 0.2 name, is one reporter's notify.
    report(events.append, "completed", record, "tenant", "POST", "/charges/{id}", 3)
    assert events[-1] == Event(
        "completed", record.digest, "/charges/{id}", "POST", digest("tenant"), 3
    )


def test_nobody_listening_costs_no_event() -> None:
    reporter = Reporter(None, record_for("idemkey", "", "GUARD", "f", "k"))
    assert reporter.keep is None
    reporter.notify("claimed")  # no hook, no debug logging: nothing built, nothing raised
    reporter.uncertain("cancelled")  # no keep: nothing kept, nothing raised


def test_the_exchange_and_the_guard_are_reporters_of_their_own_names() -> None:
    events: list[Event] = []
    policy = Policy(on_event=events.append, scope=lambda request: "tenant")
    request = Request("POST", "/charges/7", "", Headers([("Idempotency-Key", "k1")]))
    exchange = begin(policy, request)
    assert isinstance(exchange, Exchange)
    assert isinstance(exchange, Reporting)
    # No route template: the event says <unknown> (a bounded label), the entry the path.
    assert (exchange.method, exchange.route, exchange.label) == ("POST", "/charges/7", "<unknown>")
    assert exchange.record == record_for(policy.prefix, "tenant", "POST", "/charges/7", "k1")

    store = fake_store(Policy(on_event=events.append))
    state = Guard(store, "k1", b"p", "tenant", None, None, "charge")
    assert isinstance(state, Reporting)
    assert (state.method, state.route, state.label, state.scope) == (
        "GUARD",
        "charge",
        "charge",
        "tenant",
    )
    assert state.keep == store.keep_uncertain
    exchange.notify("claimed", 1)
    state.notify("claimed", 2)
    assert [(e.route, e.method, e.scope_digest) for e in events] == [
        ("<unknown>", "POST", digest("tenant")),
        ("charge", "GUARD", digest("tenant")),
    ]


def test_debug_logging_alone_hears_the_claim_the_completion_and_the_replay(caplog: Any) -> None:
    # No hook: the exchange's inlined "is anybody listening" check must still send the two
    # events of the hot path (claimed, completed, replayed) to the idemkey logger at DEBUG.
    from werkzeug.test import Client

    from idemkey.adapters.wsgi import IdempotencyMiddleware

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"made"]

    guarded = IdempotencyMiddleware(app, fake_store(Policy(scope=lambda request: "tenant")))
    with caplog.at_level("DEBUG", logger="idemkey"):
        for _ in range(2):
            answer = Client(guarded).post(
                "/orders", data=b"{}", headers={"Idempotency-Key": "k1"}, buffered=True
            )
            assert answer.status_code == 201
    heard = [r.idemkey_event for r in caplog.records if hasattr(r, "idemkey_event")]
    assert heard[:2] == ["claimed", "completed"], heard
    assert "replayed" in heard, heard
