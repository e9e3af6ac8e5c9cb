"""What ``Policy(compress=...)`` saves and costs on a realistic 10 KiB JSON response.

::

    python -m benchmarks.compression                 # bytes and CPU (no Redis needed)
    python -m benchmarks.compression --redis-url redis://127.0.0.1:6379/0   # + MEMORY USAGE

The body is a page of orders as a payments API returns it (ids, amounts, currencies,
timestamps, nested customers with addresses, line items), built from a fixed seed so every run
stores the same bytes. CPU is process CPU per call, best of a few repeats of a warm loop:
the codec's share of a completion (encode) and of a replay (decode), with and without
compression. ``python -m benchmarks`` (full run) prints the same table.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import time
import timeit
import zlib
from collections.abc import Callable
from typing import Any

from idemkey import Policy, RedisStore
from idemkey._codec import StoredResponse, decode_response, encode_response
from idemkey._core import payload_fingerprint, record_for

__all__ = ["BODY_SIZE", "compression", "format_compression", "orders_json"]

BODY_SIZE = 10 * 1024
LEVELS = (1, 3, 6, 9)
#: Smaller pages, for where the default threshold (compress=True: 1 KiB) should sit.
SMALL_SIZES = (512, 1024, 2048, 4096)
_HEADERS = (("content-type", "application/json"), ("location", "/v1/orders?page=2"))


def orders_json(size: int = BODY_SIZE, seed: int = 7) -> bytes:
    """A JSON page of orders, as close to ``size`` bytes as whole orders allow (at most it)."""
    rng = random.Random(seed)
    orders: list[dict[str, Any]] = []
    body = b""
    while True:
        orders.append(_order(rng, len(orders)))
        page = {"object": "list", "url": "/v1/orders", "has_more": True, "data": orders}
        candidate = json.dumps(page, separators=(",", ":")).encode()
        if len(candidate) > size:
            return body
        body = candidate


def _order(rng: random.Random, i: int) -> dict[str, Any]:
    return {
        "id": f"ord_{rng.getrandbits(96):024x}",
        "object": "order",
        "created": 1764540000 + 37 * i,
        "status": rng.choice(["paid", "pending", "shipped", "refunded"]),
        "amount": rng.randint(100, 500_000),
        "currency": rng.choice(["eur", "usd", "gbp"]),
        "customer": {
            "id": f"cus_{rng.getrandbits(64):016x}",
            "email": f"user{rng.randint(1, 99_999)}@example.com",
            "address": {
                "line1": f"{rng.randint(1, 999)} {rng.choice(['Main', 'High', 'Oak'])} Street",
                "city": rng.choice(["Berlin", "Paris", "London", "Austin", "Osaka"]),
                "postal_code": f"{rng.randint(10_000, 99_999)}",
                "country": rng.choice(["DE", "FR", "GB", "US", "JP"]),
            },
        },
        "items": [
            {
                "sku": f"SKU-{rng.randint(1000, 9999)}",
                "quantity": rng.randint(1, 5),
                "unit_amount": rng.randint(100, 20_000),
            }
            for _ in range(rng.randint(1, 3))
        ],
        "metadata": {"channel": rng.choice(["web", "ios", "android"])},
    }


def _cpu_us(fn: Callable[[], object], number: int = 2000, repeat: int = 5) -> float:
    """Process CPU per call, microseconds: the best of ``repeat`` warm loops."""
    fn()
    runs = timeit.repeat(fn, timer=time.process_time, number=number, repeat=repeat)
    return min(runs) / number * 1e6


def compression(
    client: Any = None, prefix: str = "bench-compress", number: int = 2000
) -> dict[str, Any]:
    """Stored bytes, CPU per completion and per replay, and (with ``client``) MEMORY USAGE.

    ``number``: calls per timed loop (each timing is the best of 5 loops).
    """

    def cpu_us(fn: Callable[[], object]) -> float:
        return _cpu_us(fn, number)

    body = orders_json()
    response = StoredResponse(201, _HEADERS, body)
    plain = encode_response(response)
    packed = encode_response(response, 0)
    inner = plain[1:]
    levels = [
        {
            "level": level,
            "stored_bytes": 1 + len(zlib.compress(inner, level)),
            "compress_us": cpu_us(lambda level=level: zlib.compress(inner, level)),
        }
        for level in LEVELS
    ]
    doc: dict[str, Any] = {
        "body_bytes": len(body),
        "plain_bytes": len(plain),
        "compressed_bytes": len(packed),
        "saved_bytes": len(plain) - len(packed),
        "levels": levels,
        "complete_plain_us": cpu_us(lambda: encode_response(response)),
        "complete_compressed_us": cpu_us(lambda: encode_response(response, 0)),
        "replay_plain_us": cpu_us(lambda: decode_response(plain)),
        "replay_compressed_us": cpu_us(lambda: decode_response(packed)),
    }
    doc["small"] = []
    for size in SMALL_SIZES:
        small = StoredResponse(201, _HEADERS, orders_json(size))
        row = {
            "body_bytes": len(small.body),
            "plain_bytes": len(encode_response(small)),
            "compressed_bytes": len(encode_response(small, 0)),
            "complete_compressed_us": cpu_us(lambda small=small: encode_response(small, 0)),
        }
        if client is not None:
            row["memory_plain"] = _memory_usage(client, prefix, encode_response(small))
            row["memory_compressed"] = _memory_usage(client, prefix, encode_response(small, 0))
        doc["small"].append(row)
    if client is not None:
        doc["memory_plain"] = _memory_usage(client, prefix, plain)
        doc["memory_compressed"] = _memory_usage(client, prefix, packed)
        for row in levels:
            stored = b"\x02" + zlib.compress(inner, row["level"])
            row["memory"] = _memory_usage(client, prefix, stored)
    return doc


def _memory_usage(client: Any, prefix: str, stored: bytes) -> int:
    """MEMORY USAGE of a record completed with ``stored``, through the store's scripts."""
    store = RedisStore(client, Policy(prefix=prefix, ttl=60.0, lease=5.0))
    record = record_for(prefix, "bench", "POST", "/v1/orders", secrets.token_hex(8))
    decision = store.claim(record, payload_fingerprint(b"{}"), heartbeat=False)
    owner = getattr(decision, "owner", None)
    if owner is None:
        raise RuntimeError(f"could not claim the compression record: {decision!r}")
    try:
        store.complete(record, owner, stored)
        return int(client.execute_command("MEMORY", "USAGE", record.key, "SAMPLES", "0"))
    finally:
        client.delete(record.key, record.lock)


def format_compression(doc: dict[str, Any]) -> list[str]:
    body, plain, packed = doc["body_bytes"], doc["plain_bytes"], doc["compressed_bytes"]
    lines = [
        f"Compression (Policy(compress=...), zlib level 1): a {body}-byte JSON page of orders",
        "",
        "| | stored bytes | MEMORY USAGE | CPU per completion us | CPU per replay us |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, size, key in (("off", plain, "plain"), ("on", packed, "compressed")):
        memory = doc.get(f"memory_{key}", "n/a")
        lines.append(
            f"| {name} | {size} | {memory} | {doc[f'complete_{key}_us']:.1f} | "
            f"{doc[f'replay_{key}_us']:.1f} |"
        )
    lines += [
        "",
        f"Saved {doc['saved_bytes']} bytes ({100 * doc['saved_bytes'] / plain:.0f}%). "
        "zlib levels on the same record:",
        "",
        "| level | stored bytes | MEMORY USAGE | compress us |",
        "|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {row['level']} | {row['stored_bytes']} | {row.get('memory', 'n/a')} | "
        f"{row['compress_us']:.1f} |"
        for row in doc["levels"]
    ]
    lines += [
        "",
        "Smaller pages (the threshold compress=True uses is 1024 bytes):",
        "",
        "| body bytes | stored off | stored on | MEMORY USAGE off | on | CPU per completion us |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {row['body_bytes']} | {row['plain_bytes']} | {row['compressed_bytes']} | "
        f"{row.get('memory_plain', 'n/a')} | {row.get('memory_compressed', 'n/a')} | "
        f"{row['complete_compressed_us']:.1f} |"
        for row in doc.get("small", ())
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compression")
    parser.add_argument("--redis-url", help="also report MEMORY USAGE on this Redis")
    args = parser.parse_args()
    client = None
    if args.redis_url:
        import redis

        client = redis.Redis.from_url(args.redis_url, decode_responses=False)
    print("\n".join(format_compression(compression(client))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
