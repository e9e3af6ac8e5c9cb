"""Helpers for the command-line tests: run ``idemkey.cli.main`` and make records to look at."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis

from idemkey import Policy, RedisStore
from idemkey._codec import StoredResponse, encode_response
from idemkey._core import Record, record_for
from idemkey.cli import main


@dataclass
class Run:
    code: int
    out: str
    err: str


CliRunner = Callable[..., Run]


@pytest.fixture
def idemkey(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """``idemkey(*argv)`` runs the command line in-process and returns code, stdout, stderr."""
    monkeypatch.delenv("IDEMKEY_REDIS_URL", raising=False)

    def run(*argv: str) -> Run:
        code = main(list(argv))
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


@pytest.fixture
def store(real_client: redis.Redis, prefix: str) -> Iterator[RedisStore]:
    """A store on the session server, writing under the test's prefix."""
    made = RedisStore(real_client, Policy(prefix=prefix))
    yield made
    made.close()


def http_record(
    store: RedisStore,
    key: str,
    *,
    scope: str = "acct_1",
    route: str = "/charges",
    status: int = 201,
    body: bytes = b'{"id":"ch_1","amount":1000}',
    complete: bool = True,
) -> Record:
    """A record as the HTTP adapters write it: claimed, and completed with a response."""
    record = record_for(store.policy.prefix, scope, "POST", route, key)
    claimed = store.claim(record, "fp-" + key, heartbeat=False)
    assert type(claimed).__name__ == "Claimed"
    if complete:
        headers = (("Content-Type", "application/json"), ("Location", "/charges/ch_1"))
        stored = encode_response(StoredResponse(status, headers, body))
        assert store.complete(record, claimed.owner, stored)  # type: ignore[union-attr]
    return record
