"""The demo payments app in Flask, guarded by :class:`idemkey.adapters.flask.Idemkey`::

    POST /charges        {"amount": 1000, "currency": "eur"}  -> 201 {"id": "ch_...", ...}
    GET  /charges        {"count": n, "processing": k, "charges": [...]}
    GET  /charges/<id>   one charge

``POST /charges`` needs an ``Idempotency-Key``; the rules are :mod:`.payments`'.
Charges live in process memory: the demo shows the records, not a ledger.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .payments import DEFAULT_ACCOUNT, Ledger, Problem, parse_charge, parse_delay

if TYPE_CHECKING:
    from flask import Flask

    from ...policy import Policy
    from ...store import RedisStore

__all__ = ["create_app"]


def _problem(problem: Problem) -> tuple[bytes, int, dict[str, str]]:
    return problem.body(), problem.status, {"Content-Type": "application/problem+json"}


def create_app(store: RedisStore, policy: Policy | None = None) -> Flask:
    """The demo payments app over ``store``; ``app.extensions["ledger"]`` holds the charges."""
    from flask import Flask, jsonify, request

    from ...adapters.flask import Idemkey

    app = Flask("idemkey.demo")
    ledger = Ledger()
    app.extensions["ledger"] = ledger
    idem = Idemkey(app, store=store, policy=policy or store.policy)

    @app.post("/charges")
    @idem.idempotent
    def create_charge() -> Any:
        try:
            data = request.get_json(silent=True)
        except RecursionError:  # nested past what json parses; silent= catches ValueError only
            data = None
        parsed = parse_charge(data)
        if isinstance(parsed, Problem):
            return _problem(parsed)
        delay = parse_delay(request.headers.get("Demo-Delay"))
        if isinstance(delay, Problem):
            return _problem(delay)
        ledger.begin()
        try:
            time.sleep(delay)  # the slow payment processor the story needs
            charge = ledger.charge(request.headers.get("Account", DEFAULT_ACCOUNT), *parsed)
        finally:
            ledger.end()
        response = jsonify(charge)
        response.status_code = 201
        response.headers["Location"] = f"/charges/{charge['id']}"
        return response

    @app.get("/charges")
    def list_charges() -> Any:
        return jsonify(ledger.listing())

    @app.get("/charges/<charge_id>")
    def get_charge(charge_id: str) -> Any:
        found = ledger.find(charge_id)
        if found is None:
            return _problem(Problem(404, "not_found", f"no charge {charge_id}"))
        return jsonify(found)

    return app
