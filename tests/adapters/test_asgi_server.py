"""The ASGI middleware under a real uvicorn server, two worker processes, real HTTP.

32 client threads send each of 50 keys 4 times, the 4 sends of a key back to back so they race
across connections and workers. The handler counts its runs in Redis with INCR, so the count is
true across processes: every key must have run exactly once.
"""

from __future__ import annotations

import sys
import textwrap
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis

from tests._servers import AppServer

pytestmark = pytest.mark.redis

#: The servers run from the checkout, as the fixtures did before AppServer: ``idemkey`` is
#: importable there without PYTHONPATH.
ROOT = Path(__file__).resolve().parents[2]

CLIENTS, KEYS, SENDS = 32, 50, 4
STARTUP_DEADLINE = 20.0

APP = textwrap.dedent(
    '''
    """A payments endpoint guarded by idemkey's ASGI middleware (run by uvicorn)."""
    import asyncio
    import json
    import os

    import redis.asyncio
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    from idemkey import AsyncRedisStore, Policy
    from idemkey.adapters.asgi import IdempotencyMiddleware

    prefix = os.environ["IDEMKEY_TEST_PREFIX"]
    client = redis.asyncio.Redis.from_url(os.environ["IDEMKEY_TEST_REDIS_URL"])
    # Duplicates wait for the first request to finish and get its replay instead of a 409.
    policy = Policy(prefix=prefix, wait=10.0)
    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, store=AsyncRedisStore(client, policy))


    @app.get("/health")
    async def health() -> dict[str, int]:
        return {"pid": os.getpid()}


    @app.post("/charges", status_code=201)
    async def charge(request: Request) -> JSONResponse:
        key = (await request.json())["key"]
        runs = await client.incr(f"{prefix}:runs:{key}")
        await asyncio.sleep(0.02)  # the payment provider's latency: duplicates overlap it
        body = {"key": key, "run": runs, "pid": os.getpid()}
        return JSONResponse(body, status_code=201)
    '''
)


@pytest.fixture
def server(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[str]:
    """uvicorn with 2 workers serving APP on a free port; yields its base URL."""
    (tmp_path / "idemkey_asgi_app.py").write_text(APP)

    def command(port: int) -> list[str]:
        return [
            sys.executable, "-m", "uvicorn", "idemkey_asgi_app:app", "--app-dir", str(tmp_path),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "2", "--log-level", "warning",
        ]  # fmt: skip

    with AppServer(
        command, log=tmp_path / "uvicorn.log", cwd=ROOT, redis_url=redis_url, prefix=prefix,
        name="uvicorn", timeout=STARTUP_DEADLINE,
    ) as served:  # fmt: skip
        yield served.url


def test_each_key_runs_once_under_concurrent_retries(
    server: str, redis_url: str, prefix: str
) -> None:
    jobs = [f"key-{k}" for k in range(KEYS) for _ in range(SENDS)]
    clients = [httpx.Client(base_url=server, timeout=20.0) for _ in range(CLIENTS)]

    def send(index: int) -> tuple[str, int, bytes, str | None]:
        key = jobs[index]
        reply = clients[index % CLIENTS].post(
            "/charges",
            headers={"Idempotency-Key": key, "Content-Type": "application/json"},
            content=b'{"key": "%s"}' % key.encode(),
        )
        return key, reply.status_code, reply.content, reply.headers.get("idempotent-replayed")

    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            replies = list(pool.map(send, range(len(jobs))))
        # Once every first request is complete, a retry gets the stored answer at once.
        late = [
            clients[0].post(
                "/charges",
                headers={"Idempotency-Key": f"key-{k}", "Content-Type": "application/json"},
                content=b'{"key": "key-%d"}' % k,
            )
            for k in range(KEYS)
        ]
    finally:
        for client in clients:
            client.close()

    bodies: dict[str, set[bytes]] = defaultdict(set)
    replayed = 0
    for key, status, body, was_replayed in replies:
        assert status == 201, (key, status, body)
        bodies[key].add(body)
        replayed += was_replayed == "true"
    assert all(len(answers) == 1 for answers in bodies.values()), bodies
    assert replayed == KEYS * (SENDS - 1)
    for k, reply in enumerate(late):
        assert reply.status_code == 201
        assert reply.headers["idempotent-replayed"] == "true"
        assert {reply.content} == bodies[f"key-{k}"]

    r = redis.Redis.from_url(redis_url)
    try:
        runs = r.mget([f"{prefix}:runs:key-{k}" for k in range(KEYS)])
    finally:
        r.close()
    assert runs == [b"1"] * KEYS
