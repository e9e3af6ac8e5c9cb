"""``python -m benchmarks.throughput_alone``: only the 64-client throughput case, on a private
redis-server, as one JSON line (the rates, the ratios) and one of the slices.

For before/after comparisons of the throughput alone, run alternated, e.g. main's tree and a
branch's, or this tree with ``IDEMKEY_BENCH_UNBATCHED=1`` (see ``http_apps.make_asgi``).
"""

from __future__ import annotations

import asyncio
import json
import secrets

import redis
import redis.asyncio

from .cases import Context
from .extra import throughput
from .servers import RedisServer


async def main(slices: int = 5, seconds: float = 1.0) -> None:
    with RedisServer() as server:
        client, aclient = redis.Redis.from_url(server.url), redis.asyncio.Redis.from_url(server.url)
        ctx = Context(client, aclient, "tp" + secrets.token_hex(3), 10)
        try:
            result = await throughput(ctx, server.url, slices=slices, seconds=seconds)
        finally:
            client.close()
            await aclient.aclose()
        if isinstance(result, str):
            raise SystemExit(f"throughput skipped: {result}")
        print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
        print(json.dumps(result["runs"]))


if __name__ == "__main__":
    asyncio.run(main())
