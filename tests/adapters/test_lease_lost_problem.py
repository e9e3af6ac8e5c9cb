"""A handler whose lease was lost (``LeaseLostError``, e.g. from ``fenced()``) before its
response started: every adapter answers a typed 409 ``lease_lost`` problem, never the
server's or framework's bare 500, and releases the key, so the retry runs (or replays)."""

from __future__ import annotations

import json

import pytest

from idemkey import LeaseLostError
from tests.adapters.harness import Answer, Backend, Harness

KEY = ("Idempotency-Key", '"lost-1"')
#: Harnesses whose framework turns the exception into its own 500 before idemkey's generic
#: middleware, wrapped around the whole app, sees it (Django's handler, Starlette's
#: ServerErrorMiddleware, Litestar's exception middleware): the key is still released. The
#: framework adapters (flask, django-middleware, fastapi, *-routes) answer the typed 409.
FRAMEWORK_500_FIRST = ("django", "starlette", "litestar")


@pytest.mark.parametrize("committed", [False, True])
def test_a_lost_lease_is_a_typed_409_and_the_key_is_released(
    harness: Harness,
    harness_kind: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    committed: bool,
) -> None:
    def explode(self: Backend) -> Answer:
        self.count("explode")
        raise LeaseLostError(7, committed=committed)

    monkeypatch.setattr(Backend, "explode", explode)
    for run in (1, 2):  # the second run proves the key was released, not stored
        reply = harness.request("POST", "/explode", headers=[KEY])
        if harness_kind[0] in FRAMEWORK_500_FIRST:
            assert reply.status == 500
            assert harness.executions["explode"] == run
            continue
        assert reply.status == 409, reply.body[:200]
        assert reply.header("content-type") == "application/problem+json"
        assert reply.header("retry-after") == "1"
        problem = json.loads(reply.body)
        assert (problem["code"], problem["retry"], problem["status"]) == (
            "lease_lost",
            "same_key",
            409,
        )
        assert ("committed" in problem["detail"]) is committed
        assert harness.executions["explode"] == run
