"""``benchmarks.compression``: the numbers `python -m benchmarks` prints for Policy(compress=...).

Not a timing test: it holds what does not depend on the machine (the stored bytes, and that
MEMORY USAGE of a compressed record is the smaller) and that the table renders.
"""

from __future__ import annotations

import json

import pytest
import redis

from benchmarks.compression import BODY_SIZE, compression, format_compression, orders_json

pytestmark = pytest.mark.redis


def test_the_orders_page_is_realistic_json_just_under_the_size() -> None:
    body = orders_json()
    assert BODY_SIZE - 1024 < len(body) <= BODY_SIZE
    page = json.loads(body)
    assert page["data"][0]["customer"]["address"]["country"]
    assert orders_json() == body  # the same bytes on every run


def test_compression_saves_stored_bytes_and_redis_memory(real_client: redis.Redis) -> None:
    doc = compression(real_client, prefix="bench-compress-test", number=5)
    assert doc["compressed_bytes"] < doc["plain_bytes"] / 3
    assert doc["memory_compressed"] < doc["memory_plain"] / 2
    assert doc["levels"][0]["level"] == 1
    assert doc["levels"][0]["stored_bytes"] == doc["compressed_bytes"]
    table = "\n".join(format_compression(doc))
    assert f"| on | {doc['compressed_bytes']} | {doc['memory_compressed']} |" in table
