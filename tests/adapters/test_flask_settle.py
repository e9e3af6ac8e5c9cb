"""When the Flask extension settles a claimed request: once the response leaves Flask, with an
answer the client was sent, and never leaving a claim open (a claim left open is renewed by the
heartbeat: every retry a 409 until the process exits).

What a real server makes of it is in test_flask_servers.py; these are the cases where Flask
itself decides: an exception Flask lets out (``PROPAGATE_EXCEPTIONS``, a teardown's), a body
idemkey cannot read, a view run without the extension's WSGI layer, and the decorators' order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from flask import Blueprint, Flask, Response

from idemkey import ConfigurationError, Policy, RedisStore
from idemkey.adapters.flask import Idemkey
from tests.adapters.harness import store_on

if TYPE_CHECKING:
    from collections.abc import Iterator

    from flask.testing import FlaskClient

KEYED = {"Idempotency-Key": "k", "Authorization": "Bearer sk_1"}


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "fakeredis"])
def store(request: pytest.FixtureRequest, prefix: str) -> Iterator[RedisStore]:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    with store_on(url, Policy(prefix=prefix, lease=5.0)) as store:
        yield store


def charging(store: RedisStore, **config: Any) -> tuple[Flask, list[str]]:
    """An app whose ``/charges`` view counts its runs."""
    idem = Idemkey(store=store)
    app = Flask("settle")
    app.config.update(config)
    runs: list[str] = []

    @app.post("/charges")
    @idem.idempotent
    def charges() -> Any:
        runs.append("ran")
        return {"run": len(runs)}, 201

    idem.init_app(app)
    return app, runs


def post(client: FlaskClient) -> Any:
    return client.post("/charges", headers=KEYED)


def test_an_after_request_error_flask_lets_out_releases_the_key(store: RedisStore) -> None:
    app, runs = charging(store, PROPAGATE_EXCEPTIONS=True)
    failures = [RuntimeError("commit failed")]

    @app.after_request
    def commit(response: Response) -> Response:
        if failures:
            raise failures.pop()
        return response

    client = app.test_client()
    with pytest.raises(RuntimeError, match="commit failed"):
        post(client)
    again = post(client)
    assert (again.status_code, again.headers.get("Idempotent-Replayed")) == (201, None)
    assert post(client).headers["Idempotent-Replayed"] == "true"
    assert runs == ["ran", "ran"]


def test_a_teardown_error_releases_the_key(store: RedisStore) -> None:
    """A teardown error leaves Flask after the response started (the server sends a 500)."""
    app, runs = charging(store)
    failures = [RuntimeError("session close failed")]

    @app.teardown_request
    def close_session(exc: BaseException | None) -> None:
        if failures:
            raise failures.pop()

    client = app.test_client()
    with pytest.raises(RuntimeError, match="session close failed"):
        post(client)
    again = post(client)
    assert (again.status_code, again.headers.get("Idempotent-Replayed")) == (201, None)
    assert runs == ["ran", "ran"]


class Unreadable:
    """A sized body whose iteration fails: werkzeug takes it for a sequence, and reading it
    (``get_data()``) raises."""

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[bytes]:
        raise OSError("the file is gone")


def test_a_body_that_cannot_be_read_releases_the_key(store: RedisStore) -> None:
    idem = Idemkey(store=store)
    app = Flask("unreadable")
    runs: list[str] = []

    @app.post("/charges")
    @idem.idempotent
    def charges() -> Any:
        runs.append("ran")
        return Response(Unreadable(), 201)

    idem.init_app(app)
    client = app.test_client()
    statuses = [post(client).status_code for _ in range(2)]
    assert statuses == [500, 500]  # never 409: the claim was released, not left open
    assert runs == ["ran", "ran"]


def test_a_view_run_without_the_wsgi_layer_settles_in_the_view(store: RedisStore) -> None:
    """Dispatched in a request context of its own (no BodyCapture around it): nothing else
    would settle the claim, so the view does, as it did before."""
    app, runs = charging(store)
    with app.test_request_context("/charges", method="POST", headers=KEYED):
        assert app.full_dispatch_request().status_code == 201
    again = post(app.test_client())
    assert again.headers["Idempotent-Replayed"] == "true"
    assert runs == ["ran"]


def test_the_guard_written_above_the_route_is_refused_at_the_first_request(
    store: RedisStore,
) -> None:
    idem = Idemkey(store=store)
    app = Flask("misordered")
    runs: list[str] = []

    @idem.idempotent
    @app.post("/charges")
    def create_charge() -> Any:
        runs.append("ran")
        return {"id": "ch_1"}, 201

    idem.init_app(app)
    client = app.test_client()
    for _ in range(2):  # every request, keyed or not: the app guards nothing as written
        with pytest.raises(ConfigurationError, match=r"create_charge.*below @app\.post"):
            client.post("/charges")
    assert runs == []


def test_the_guard_written_above_a_blueprint_route_is_refused(store: RedisStore) -> None:
    idem = Idemkey(store=store)
    bp = Blueprint("charges", __name__)

    @idem.idempotent(required=False)
    @bp.post("/charges")
    def create_charge() -> Any:
        return {"id": "ch_1"}, 201

    app = Flask("misordered_bp")
    idem.init_app(app)
    app.register_blueprint(bp)
    with pytest.raises(ConfigurationError, match=r"charges\.create_charge"):
        app.test_client().post("/charges", headers=KEYED)


def test_a_view_registered_guarded_and_also_unguarded_is_not_refused(store: RedisStore) -> None:
    """The same function under two rules, one guarded: the guard is registered, so nothing
    was written in the wrong order."""
    idem = Idemkey(store=store)
    app = Flask("both")

    def create_charge() -> Any:
        return {"id": "ch_1"}, 201

    app.add_url_rule("/charges", "guarded", idem.idempotent(create_charge), methods=["POST"])
    app.add_url_rule("/internal/charges", "plain", create_charge, methods=["POST"])
    idem.init_app(app)
    client = app.test_client()
    assert post(client).status_code == 201
    assert post(client).headers["Idempotent-Replayed"] == "true"
    assert client.post("/internal/charges").status_code == 201


def test_a_guarded_view_called_from_another_settles_too(store: RedisStore) -> None:
    """Two claims in one request (the inner view on records of its own): the outer view's
    answer is settled once it left Flask, whichever view returned first, and the inner one in
    its view, so neither claim is left open and an after_request failure releases the outer."""
    idem = Idemkey(store=store)
    app = Flask("nested")
    app.config["PROPAGATE_EXCEPTIONS"] = False
    runs: list[str] = []
    failures = [RuntimeError("commit failed")]

    @idem.idempotent(prefix=store.policy.prefix + "inner")
    def audit() -> Any:
        runs.append("audit")
        return {"audited": True}, 201

    @app.post("/charges")
    @idem.idempotent
    def charges() -> Any:
        runs.append("charge")
        audit()
        return {"charged": True}, 201

    @app.after_request
    def commit(response: Response) -> Response:
        if failures:
            raise failures.pop()
        return response

    idem.init_app(app)
    client = app.test_client()
    assert post(client).status_code == 500  # the client never got the outer view's 201
    again = post(client)
    assert (again.status_code, again.headers.get("Idempotent-Replayed")) == (201, None)
    assert post(client).headers["Idempotent-Replayed"] == "true"
    with app.test_request_context("/charges", method="POST", headers=KEYED):
        inner = app.make_response(audit())  # its own record: completed in the view, replayed
    assert inner.headers["Idempotent-Replayed"] == "true"
    assert runs == ["charge", "audit", "charge"]


def test_one_idemkey_shared_by_two_apps_checks_the_order_across_them(store: RedisStore) -> None:
    """An Idemkey serves any number of apps: a guard one app registers is not misordered
    because another app (an admin one) registers the bare function; a guard no app registers
    still is, in the app that registers the bare function."""

    def create_charge() -> Any:
        return {"id": "ch_1"}, 201

    def refund() -> Any:
        return {"id": "re_1"}, 201

    for misordered in (False, True):
        idem = Idemkey(store=store)
        public, admin = Flask("public"), Flask("admin")
        public.add_url_rule("/charges", "c", idem.idempotent(create_charge), methods=["POST"])
        admin.add_url_rule("/charges", "c", create_charge, methods=["POST"])  # unguarded
        if misordered:  # guarded, and registered by no app: written above the route
            idem.idempotent(refund)
            admin.add_url_rule("/refunds", "r", refund, methods=["POST"])
        idem.init_app(public)
        idem.init_app(admin)
        assert public.test_client().post("/charges", headers=KEYED).status_code == 201
        if misordered:
            with pytest.raises(ConfigurationError, match=r"refund \(endpoint 'r'\)"):
                admin.test_client().post("/charges")
        else:
            assert admin.test_client().post("/charges").status_code == 201
