"""Waiters: N identical concurrent requests on uvicorn (or gunicorn) with ``Policy.wait > 0``.

One request runs the handler (which takes ``--hold`` seconds); the others wait for it and get
its replay. Reported: Redis calls per waiter (``INFO commandstats`` deltas of ``evalsha`` and
``xread`` on a private redis-server, so nothing else counts) and wake-up latency: when each
replay arrived, after the first request's response (the completion is written just after it).

    python -m benchmarks.waiters                         # this checkout's idemkey
    python -m benchmarks.waiters --idemkey /work/wt/before --runs 3
    python -m benchmarks.waiters --server gunicorn      # the WSGI middleware, a thread each

``--idemkey`` is the directory put first on the server's PYTHONPATH, so two checkouts are
measured by one script.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from .servers import HOST, RedisServer, free_port

APP = """
import asyncio, os, time
import redis.asyncio
from idemkey import AsyncRedisStore, Policy
from idemkey.adapters.asgi import IdempotencyMiddleware

HOLD = float(os.environ["WAITERS_HOLD"])


async def charge(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/charges":
        await asyncio.sleep(HOLD)  # the payment provider: the duplicates wait meanwhile
    await send({"type": "http.response.start", "status": 201,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"id": "ch_1"}'})


def make():
    client = redis.asyncio.Redis.from_url(os.environ["WAITERS_REDIS_URL"], max_connections=512)
    store = AsyncRedisStore(client, Policy(prefix="bench", wait=10.0))
    return IdempotencyMiddleware(charge, store)


def charge_wsgi(environ, start_response):
    environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    if environ["PATH_INFO"] == "/charges":
        time.sleep(HOLD)  # the payment provider: the duplicates wait meanwhile
    start_response("201 Created", [("Content-Type", "application/json")])
    return [b'{"id": "ch_1"}']


def make_wsgi():
    import redis
    from idemkey import RedisStore
    from idemkey.adapters.wsgi import IdempotencyMiddleware as WSGIMiddleware

    client = redis.Redis.from_url(os.environ["WAITERS_REDIS_URL"], max_connections=512)
    store = RedisStore(client, Policy(prefix="bench", wait=10.0))
    return WSGIMiddleware(charge_wsgi, store)
"""

#: How each server runs the app (one worker; gunicorn with a thread per request).
SERVERS = {
    "uvicorn": lambda port, requests: [
        sys.executable, "-m", "uvicorn", "--factory", "waiters_app:make", "--host", HOST,
        "--port", str(port), "--log-level", "warning", "--no-access-log", "--lifespan", "off",
    ],
    "gunicorn": lambda port, requests: [
        sys.executable, "-m", "gunicorn", "--bind", f"{HOST}:{port}", "--workers", "1",
        "--worker-class", "gthread", "--threads", str(requests + 5), "--log-level", "warning",
        "waiters_app:make_wsgi()",
    ],
}  # fmt: skip


def _calls(admin: redis.Redis) -> dict[str, int]:
    stats = admin.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def _burst(base: str, key: str, requests: int) -> list[tuple[float, bool, int]]:
    """``requests`` identical POSTs at once; per response (arrival, replayed, status)."""
    limits = httpx.Limits(max_connections=requests + 5, max_keepalive_connections=requests + 5)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
        # Open every connection first, so the burst is not a burst of TCP handshakes.
        await asyncio.gather(*(client.post("/warm", content=b"{}") for _ in range(requests)))
        start = asyncio.Event()

        async def send() -> tuple[float, bool, int]:
            await start.wait()
            response = await client.post(
                "/charges", content=b'{"amount": 1999}', headers={"Idempotency-Key": key}
            )
            replayed = response.headers.get("Idempotent-Replayed") == "true"
            return time.monotonic(), replayed, response.status_code

        tasks = [asyncio.create_task(send()) for _ in range(requests)]
        await asyncio.sleep(0.05)
        start.set()
        return await asyncio.gather(*tasks)


def run(
    idemkey_root: str, requests: int, hold: float, runs: int, server_kind: str = "uvicorn"
) -> list[dict[str, Any]]:
    results = []
    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "waiters_app.py").write_text(APP)
        admin = redis.Redis.from_url(server.url)
        port = free_port()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join((idemkey_root, tmp)),
            "WAITERS_REDIS_URL": server.url,
            "WAITERS_HOLD": str(hold),
        }
        proc = subprocess.Popen(SERVERS[server_kind](port, requests), env=env, cwd=tmp)
        base = f"http://{HOST}:{port}"
        try:
            deadline = time.monotonic() + 15
            while True:
                try:
                    httpx.post(f"{base}/warm", timeout=1)
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(0.05)
            asyncio.run(_burst(base, "warm-up", 2))  # loads the scripts
            for index in range(runs):
                before = _calls(admin)
                answers = asyncio.run(_burst(base, f"charge-{index}", requests))
                after = _calls(admin)
                spent = {k: v - before.get(k, 0) for k, v in after.items() if k != "info"}
                owners = [arrived for arrived, replayed, status in answers if not replayed]
                assert len(owners) == 1, answers
                assert all(status == 201 for _, _, status in answers), answers
                wakes = sorted(
                    (arrived - owners[0]) * 1000 for arrived, replayed, _ in answers if replayed
                )
                waiters = len(wakes)
                results.append(
                    {
                        "evalsha": spent.get("evalsha", 0),
                        "xread": spent.get("xread", 0),
                        "per_waiter": (spent.get("evalsha", 0) + spent.get("xread", 0) - 2)
                        / waiters,
                        "wake_p50_ms": statistics.median(wakes),
                        "wake_max_ms": wakes[-1],
                        "commands": sum(spent.values()),
                    }
                )
        finally:
            proc.terminate()
            proc.wait(10)
            admin.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idemkey", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--hold", type=float, default=0.5, help="seconds the handler takes")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--server", choices=sorted(SERVERS), default="uvicorn")
    args = parser.parse_args(argv)
    print(f"{args.requests} identical requests on {args.server}, handler "
          f"{args.hold * 1000:g} ms, idemkey from {args.idemkey}")  # fmt: skip
    print("run  EVALSHA  XREAD  (calls-2)/waiter  wake p50 ms  wake max ms  all commands")
    for index, r in enumerate(run(args.idemkey, args.requests, args.hold, args.runs, args.server)):
        counts = f"{index:>3}  {r['evalsha']:>7}  {r['xread']:>5}  {r['per_waiter']:>15.2f}"
        wakes = f"{r['wake_p50_ms']:>11.1f}  {r['wake_max_ms']:>11.1f}  {r['commands']:>12}"
        print(f"{counts}  {wakes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
