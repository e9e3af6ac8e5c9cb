"""Remembered failures through the HTTP adapters, on real servers (uvicorn + FastAPI, gunicorn
+ Flask): a declared exception is the framework's to render (an exception handler, an
errorhandler), and the response it renders is what idemkey stores and replays.

What a user relies on: a 402 from a card declined is replayed as the same 402 with
``Idempotent-Replayed: true``, the handler not run again; a transient exception (the
framework's 503) releases the key, and the retry runs and succeeds.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests._servers import AppServer

APP = Path(__file__).with_name("failure_apps.py")

COMMANDS = {
    "fastapi": lambda port: [
        sys.executable, "-m", "uvicorn", "--factory", "idemkey_failure_apps:fastapi_app",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
    ],
    "flask": lambda port: [
        sys.executable, "-m", "gunicorn", "--workers", "1", "--bind", f"127.0.0.1:{port}",
        "--log-level", "warning", "idemkey_failure_apps:flask_app()",
    ],
}  # fmt: skip


@pytest.fixture(params=sorted(COMMANDS))
def server(
    request: pytest.FixtureRequest, redis_url: str, tmp_path: Path
) -> Iterator[tuple[AppServer, str]]:
    prefix = "f" + uuid.uuid4().hex[:12]
    (tmp_path / "idemkey_failure_apps.py").write_text(APP.read_text())
    started = AppServer(
        COMMANDS[request.param], log=tmp_path / "server.log", cwd=tmp_path,
        redis_url=redis_url, prefix=prefix, name=request.param,
    )  # fmt: skip
    yield started, prefix
    started.close()


def test_a_declared_failure_replays_as_its_stored_response_and_a_transient_one_runs_again(
    server: tuple[AppServer, str], redis_url: str
) -> None:
    app, prefix = server
    counter = redis.Redis.from_url(redis_url)
    with httpx.Client(base_url=app.url, timeout=20) as http:
        answers = [
            http.post("/charges", params={"card": "declined"}, headers={"Idempotency-Key": "k1"})
            for _ in range(3)
        ]
        assert [a.status_code for a in answers] == [402, 402, 402]
        assert {a.json()["error"] for a in answers} == {"card declined: insufficient_funds"}
        assert [a.headers.get("Idempotent-Replayed") for a in answers] == [None, "true", "true"]
        assert counter.get(f"{prefix}:runs:k1") == b"1"

        flaky = [
            http.post("/charges", params={"card": "flaky"}, headers={"Idempotency-Key": "k2"})
            for _ in range(3)
        ]
        assert [a.status_code for a in flaky] == [503, 200, 200]
        assert flaky[1].json() == flaky[2].json() == {"charged": True, "runs": 2}
        assert counter.get(f"{prefix}:runs:k2") == b"2"
    counter.close()
