"""Measurements that are not per-call latencies: throughput under concurrency, and memory.

* Throughput: 64 concurrent asyncio HTTP clients, each with its own keys, send keep-alive
  requests to the ASGI app under uvicorn (one worker), with and without idemkey's middleware,
  and with the bare floor (the app plus two bare EVALSHA calls), alternating in short slices
  so all see the same noise; requests per second is the median over the slices. With
  valkey-glide installed, idemkey on glide and glide's own floor run in the same slices.
  (In-process, the app alone never awaits anything and would measure only the client loop.)
* Memory: ``MEMORY USAGE`` of one completed record against the size of what it stores, for a
  guard result and for an HTTP response (status, one header, body) as the adapters store it,
  beside the floor: a plain Redis string holding the same bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from typing import Any

from idemkey import RedisStore, guard
from idemkey._codec import StoredResponse, encode_response
from idemkey._core import payload_fingerprint, record_for

from .cases import PAYLOAD, Context
from .servers import HttpServer, ServerError

__all__ = ["CLIENTS", "SIZES", "memory_per_record", "throughput"]

CLIENTS = 64
SIZES = (100, 1024, 10 * 1024)


async def _http_client(
    port: int, path: bytes, label: bytes, deadline: float, counts: list[int], c: int
) -> None:
    """One keep-alive HTTP/1.1 client: POST with a fresh key until the deadline.

    Raw asyncio streams, not an HTTP library: on two cores a heavy client would measure itself.
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (b"POST " + path + b" HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nIdempotency-Key: " % len(PAYLOAD))  # fmt: skip
    n = 0
    try:
        while time.perf_counter() < deadline:
            n += 1
            writer.write(head + b"%b:%d:%d\r\n\r\n" % (label, c, n) + PAYLOAD)
            answer = await reader.readuntil(b"\r\n\r\n")
            if answer[9:12] != b"201":
                raise RuntimeError(f"{path.decode()} answered {answer[9:12].decode()}")
            length = 0
            for line in answer.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            counts[0] += 1
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _has_glide() -> bool:
    try:
        import glide  # noqa: F401
    except ImportError:
        return False
    return True


async def throughput(
    ctx: Context, url: str, *, slices: int, seconds: float
) -> dict[str, Any] | str:
    """Requests per second with and without idemkey over uvicorn, or why it was skipped."""
    try:
        import idemkey.adapters.asgi  # noqa: F401
    except ImportError as exc:
        return f"idemkey.adapters.asgi cannot be imported: {exc}"
    env = {"IDEMKEY_BENCH_REDIS_URL": url, "IDEMKEY_BENCH_PREFIX": ctx.prefix}
    try:
        server = HttpServer("uvicorn", "benchmarks.http_apps:make_asgi", env)
    except ServerError as exc:
        return f"uvicorn did not start: {exc}"
    try:

        async def drive(path: bytes, label: bytes) -> float:
            counts = [0]
            start = time.perf_counter()
            deadline = start + seconds
            await asyncio.gather(
                *(_http_client(server.port, path, label, deadline, counts, c)
                  for c in range(CLIENTS))
            )  # fmt: skip
            return counts[0] / (time.perf_counter() - start)

        paths = {"plain": b"/asgi/plain", "floor": b"/asgi/floor", "idemkey": b"/asgi/guarded"}
        if _has_glide():  # the same app's glide routes (benchmarks/glide_bench.py)
            paths.update({"glide_floor": b"/asgi/glide-floor", "glide": b"/asgi/glide"})
        runs: dict[str, list[float]] = {name: [] for name in paths}
        for name in ("idemkey", "floor", "glide", "glide_floor"):
            if name in paths:
                await drive(paths[name], b"tp-warm-" + name.encode())
        for i in range(slices):
            for name, path in paths.items():
                runs[name].append(await drive(path, b"tp-%b-%d" % (name.encode(), i)))
    finally:
        server.close()
    plain_rps = statistics.median(runs["plain"])
    floor_rps = statistics.median(runs["floor"])
    guarded_rps = statistics.median(runs["idemkey"])
    glide_rows: dict[str, Any] = {}
    if "glide" in runs:
        glide_rps = statistics.median(runs["glide"])
        glide_rows = {
            "glide_floor_rps": statistics.median(runs["glide_floor"]),
            "glide_rps": glide_rps,
            "glide_ratio_to_floor": glide_rps / floor_rps if floor_rps else None,
        }
    return {
        **glide_rows,
        "clients": CLIENTS,
        "server": "uvicorn, 1 worker, real HTTP/1.1 keep-alive",
        "slices": slices,
        "slice_seconds": seconds,
        "plain_rps": plain_rps,
        "floor_rps": floor_rps,
        "idemkey_rps": guarded_rps,
        "ratio": guarded_rps / plain_rps if plain_rps else None,
        "ratio_to_floor": guarded_rps / floor_rps if floor_rps else None,
        "runs": runs,
    }


def memory_per_record(ctx: Context, client: Any) -> list[dict[str, Any]]:
    """Bytes Redis holds per completed record, for each size in :data:`SIZES`, beside the floor:
    a plain Redis string holding the same stored bytes under a name of the same length."""
    store = RedisStore(client, ctx.policy)
    ctx.stores.append(store)
    rows = []
    for size in SIZES:
        value = os.urandom(size)
        key = f"memory:guard:{size}"
        with guard(store, key, payload=PAYLOAD) as call:
            if not call.replayed:
                call.save(value)
        guard_record = record_for(ctx.prefix, "", "GUARD", "", key)
        guard_bytes = _usage(client, guard_record.key)

        response = StoredResponse(201, (("content-type", "application/json"),), os.urandom(size))
        http_record = record_for(ctx.prefix, "bench", "POST", "/charges", f"memory:{size}")
        decision = store.claim(http_record, payload_fingerprint(PAYLOAD), heartbeat=False)
        owner = getattr(decision, "owner", None)
        if owner is None:
            raise RuntimeError(f"could not claim the memory record: {decision!r}")
        store.complete(http_record, owner, encode_response(response))
        http_bytes = _usage(client, http_record.key)
        # A completed record keeps no lease: no field, and no 0.2 lock string either.
        lock_left = sum(client.hexists(r.key, "lease") for r in (guard_record, http_record))
        lock_left += client.exists(guard_record.lock, http_record.lock)
        rows.append({
            "size": size,
            "guard_record_bytes": guard_bytes,
            "guard_floor_bytes": _floor(ctx, client, guard_record.key, f"guard:{size}"),
            "http_record_bytes": http_bytes,
            "http_floor_bytes": _floor(ctx, client, http_record.key, f"http:{size}"),
            "guard_overhead": guard_bytes - size,
            "http_overhead": http_bytes - size,
            "locks_left": int(lock_left),
        })  # fmt: skip
    return rows


def _usage(client: Any, key: str) -> int:
    return int(client.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0"))


def _floor(ctx: Context, client: Any, record_key: str, label: str) -> int:
    """MEMORY USAGE of a plain string holding the record's stored bytes, under a key name as
    long as the record's (another digest in the same prefix)."""
    name = record_for(ctx.prefix, "floor", "POST", "/", label).key
    assert len(name) == len(record_key)
    client.set(name, client.hget(record_key, "resp"))
    try:
        return _usage(client, name)
    finally:
        client.delete(name)
