"""A guarded view called from inside another guarded view of the same request.

On records of its own (its own prefix), a nested view holds a claim of its own: a streamed
answer settles as the outermost one's does (completed at its first byte, released on a failure
before it), and a stream the outer view discards is released when the request ends. On the
outer view's record (a route delegating to another guarded view, a view calling itself), it is
the same work: it runs under the outer view's claim, never a 409 against it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from flask import Flask, Response, g

from idemkey import Policy, RedisStore
from idemkey.adapters.flask import Idemkey
from tests.adapters.harness import store_on

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

KEYED = {"Idempotency-Key": "k", "Authorization": "Bearer sk_1"}


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "fakeredis"])
def store(request: pytest.FixtureRequest, prefix: str) -> Iterator[RedisStore]:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    with store_on(url, Policy(prefix=prefix, lease=5.0)) as store:
        yield store


def exporting(store: RedisStore, fails: list[str]) -> tuple[Flask, Callable[[], Any], list[str]]:
    """``/export`` returns a stream from ``export``, a guarded view on records of its own; the
    stream fails before its first byte while ``fails`` is not empty."""
    idem = Idemkey(store=store)
    app = Flask("nested_stream")
    runs: list[str] = []

    @app.post("/inner")
    @idem.idempotent(prefix=store.policy.prefix + "inner")
    def export() -> Any:
        runs.append("inner")

        def rows() -> Iterator[bytes]:
            if fails:
                raise RuntimeError(fails.pop())
            yield b"rows"

        return Response(rows(), mimetype="text/csv")

    @app.post("/export")
    @idem.idempotent
    def outer() -> Any:
        runs.append("outer")
        return export()

    @app.post("/discard")
    @idem.idempotent
    def discard() -> Any:
        runs.append("outer")
        export()  # never returned: its stream never reaches the server
        return {"discarded": True}, 201

    idem.init_app(app)
    return app, export, runs


def inner_answer(app: Flask, path: str, export: Callable[[], Any]) -> Response:
    """The inner view's answer on its record from ``path`` (the request's rule names it)."""
    with app.test_request_context(path, method="POST", headers=KEYED):
        return app.make_response(export())


def test_a_nested_stream_that_fails_before_its_first_byte_is_released(store: RedisStore) -> None:
    app, _, runs = exporting(store, ["export failed"])
    client = app.test_client()
    with pytest.raises(RuntimeError, match="export failed"):
        client.post("/export", headers=KEYED)
    again = client.post("/export", headers=KEYED)
    assert (again.status_code, again.headers.get("Idempotent-Replayed")) == (200, None)
    assert again.get_data() == b"rows"  # the retry ran both views again
    assert runs == ["outer", "inner", "outer", "inner"]


def test_a_nested_stream_sent_is_completed_without_its_body(store: RedisStore) -> None:
    app, export, runs = exporting(store, [])
    client = app.test_client()
    first = client.post("/export", headers=KEYED)
    assert (first.status_code, first.get_data()) == (200, b"rows")
    again = client.post("/export", headers=KEYED)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Idempotent-Body-Not-Kept"] == "true"
    inner = inner_answer(app, "/export", export)  # the inner view's record: completed too
    assert inner.headers["Idempotent-Replayed"] == "true"
    assert inner.headers["Idempotent-Body-Not-Kept"] == "true"
    assert runs == ["outer", "inner"]


def test_a_nested_stream_the_outer_view_discards_is_released_when_the_request_ends(
    store: RedisStore,
) -> None:
    app, export, runs = exporting(store, [])
    client = app.test_client()
    with client.post("/discard", headers=KEYED) as first:  # the server closes what it sent
        assert first.status_code == 201
    # Never sent: the inner view's record is released, neither held (every retry a 409) nor
    # completed with a head no client got.
    inner = inner_answer(app, "/discard", export)
    assert (inner.status_code, inner.headers.get("Idempotent-Replayed")) == (200, None)
    inner.close()
    assert client.post("/discard", headers=KEYED).headers["Idempotent-Replayed"] == "true"
    assert runs == ["outer", "inner", "inner"]


def test_a_nested_stream_is_released_when_the_outer_view_raises(store: RedisStore) -> None:
    idem = Idemkey(store=store)
    app = Flask("nested_raise")
    app.config["PROPAGATE_EXCEPTIONS"] = False
    runs: list[str] = []

    @idem.idempotent(prefix=store.policy.prefix + "inner")
    def export() -> Any:
        runs.append("inner")
        return Response(iter([b"rows"]), mimetype="text/csv")

    @app.post("/export")
    @idem.idempotent
    def outer() -> Any:
        export()
        raise RuntimeError("the outer view failed")

    idem.init_app(app)
    client = app.test_client()
    assert client.post("/export", headers=KEYED).status_code == 500
    assert client.post("/export", headers=KEYED).status_code == 500  # released: ran again
    assert runs == ["inner", "inner"]


def delegating(store: RedisStore) -> tuple[Flask, list[str]]:
    """``/v1/charges`` (a legacy route) returns what ``create_charge`` answers: both guarded,
    on the app's policy, so on one record."""
    idem = Idemkey(store=store)
    app = Flask("delegate")
    runs: list[str] = []

    @app.post("/v2/charges")
    @idem.idempotent
    def create_charge() -> Any:
        runs.append("charge")
        assert g.idemkey is not None  # the outer view's claim
        assert g.idemkey.claim is not None
        return {"id": f"ch_{len(runs)}"}, 201

    @app.post("/v1/charges")
    @idem.idempotent
    def legacy_create_charge() -> Any:
        return create_charge()

    @app.post("/charges/<int:depth>")
    @idem.idempotent
    def recursive(depth: int) -> Any:
        runs.append(f"depth {depth}")
        if depth:
            return recursive(depth - 1)
        return {"id": f"ch_{len(runs)}"}, 201

    idem.init_app(app)
    return app, runs


def test_a_view_delegating_to_a_guarded_view_on_its_record_runs_it_under_its_claim(
    store: RedisStore,
) -> None:
    app, runs = delegating(store)
    client = app.test_client()
    first = client.post("/v1/charges", json={"a": 1}, headers=KEYED)
    assert (first.status_code, first.get_json()) == (201, {"id": "ch_1"})
    again = client.post("/v1/charges", json={"a": 1}, headers=KEYED)
    assert (again.status_code, again.get_json()) == (201, {"id": "ch_1"})
    assert again.headers["Idempotent-Replayed"] == "true"
    assert runs == ["charge"]


def test_a_guarded_view_calling_itself_runs_under_its_own_claim(store: RedisStore) -> None:
    app, runs = delegating(store)
    client = app.test_client()
    first = client.post("/charges/2", headers=KEYED)
    assert (first.status_code, first.get_json()) == (201, {"id": "ch_3"})
    again = client.post("/charges/2", headers=KEYED)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.get_json() == {"id": "ch_3"}
    assert runs == ["depth 2", "depth 1", "depth 0"]


def test_after_a_nested_view_returns_the_outer_view_runs_under_its_claim_again(
    store: RedisStore,
) -> None:
    """``g.idemkey`` is the outer view's again once a nested view (its own claim) returned, so
    a view it delegates to next is recognised as the same work."""
    idem = Idemkey(store=store)
    app = Flask("nested_then_delegate")
    seen: list[Any] = []

    @idem.idempotent(prefix=store.policy.prefix + "audit")
    def audit() -> Any:
        seen.append(g.idemkey)
        return {"audited": True}, 201

    @app.post("/v2/charges")
    @idem.idempotent
    def create_charge() -> Any:
        seen.append(g.idemkey)
        return {"id": "ch_1"}, 201

    @app.post("/v1/charges")
    @idem.idempotent
    def legacy() -> Any:
        seen.append(g.idemkey)
        audit()
        return create_charge()

    idem.init_app(app)
    client = app.test_client()
    assert client.post("/v1/charges", headers=KEYED).status_code == 201
    outer, inner, delegated = seen
    assert inner is not outer
    assert delegated is outer
    assert client.post("/v1/charges", headers=KEYED).headers["Idempotent-Replayed"] == "true"
