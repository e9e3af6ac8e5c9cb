"""Reading records' status for ``AsyncRedisStore.records()`` and ``.record()``: SCAN with
COUNT on every primary (never KEYS), one pipeline per page, decoded by ``status.py``.

Memory stays bounded by one page: records are yielded as each page is read, never gathered.
"""

# unasync: generates _sync_status.py
from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Sequence
from typing import Any

from .._core import LOCK_HINT
from .status import (
    WIRE_FIELDS,
    RecordStatus,
    StatusFields,
    decode_status,
    lease_left_ms,
    pttl_ms,
    record_pattern,
    redirected,
    server_ms,
    status_fields,
    wanted,
)

__all__ = ["read_statuses", "scan_statuses"]


def _targets(client: Any) -> list[tuple[dict[str, Any], Any]]:
    """(execute_command kwargs, the client to read a page with) per server to scan: each
    primary of a cluster, or the one. A page's keys all live on the node scanned: its own
    connection reads them in one plain pipeline where the client has one per node (redis-py's
    sync cluster), three times faster than a cluster pipeline sorting them into slots."""
    primaries = getattr(client, "get_primaries", None)
    if primaries is None:
        return [({}, client)]
    return [
        ({"target_nodes": node}, getattr(node, "redis_connection", None) or client)
        for node in primaries()
    ]


async def read_statuses(
    client: Any, keys: Sequence[bytes | str], cluster: Any = None
) -> list[RecordStatus]:
    """The status of each record in ``keys`` that exists (two pipelines at most: the second
    only for records with finished steps, or claims written by 0.2).

    ``cluster``: the cluster client when ``client`` is one node's own. That node redirects the
    keys it no longer serves (ASK while their slot migrates, MOVED after a failover): they are
    read again through ``cluster``, whose pipeline follows the redirects."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, *WIRE_FIELDS)
        pipe.pttl(key)
    # The lease is a deadline on the server's clock (claim.lua). In a cluster, TIME is asked of
    # the client's default node: the nodes' clocks are as close as their PX expiries need.
    pipe.execute_command("TIME")
    replies = await pipe.execute(raise_on_error=False)
    now_ms = server_ms(replies[-1])
    rows: list[tuple[bytes | str, StatusFields, int]] = []
    stepped, legacy, elsewhere = [], [], []
    for i, key in enumerate(keys):
        reply, ttl = replies[2 * i : 2 * i + 2]
        if cluster is not None and redirected(reply, ttl):
            elsewhere.append(key)
            continue
        if not isinstance(reply, list) or isinstance(ttl, Exception):
            continue  # not a hash's fields: a stranger's key under the prefix
        fields = status_fields(reply)
        rows.append((key, fields, pttl_ms(ttl)))
        if fields.steps is not None:  # finished steps, named by their fields
            stepped.append(key)
        if fields.state == b"in_progress" and fields.lease is None:
            legacy.append(key)  # a claim written by 0.2 keeps its lease in a lock string
    names: dict[bytes | str, list[bytes]] = {}
    locks: dict[bytes | str, object] = {}
    if stepped or legacy:
        pipe = client.pipeline(transaction=False)
        for key in stepped:
            pipe.hkeys(key)
        for key in legacy:  # reading 0.2 claims: remove in 0.4
            pipe.pttl(_lock_name(key))
        more = await pipe.execute(raise_on_error=False)
        for key, found in zip(stepped, more[: len(stepped)], strict=True):
            names[key] = found if isinstance(found, list) else []
        locks = dict(zip(legacy, more[len(stepped) :], strict=True))
    statuses = (
        decode_status(
            key,
            fields,
            ttl,
            lease_left_ms(fields.lease, locks.get(key), now_ms),
            names.get(key, ()),
        )
        for key, fields, ttl in rows
    )
    found = [status for status in statuses if status is not None]
    if elsewhere:
        found += await read_statuses(cluster, elsewhere)
    return found


def _lock_name(key: bytes | str) -> bytes | str:
    """0.2's lock string of the record ``key`` as SCAN named it (``Record.lock_key``)."""
    return key + LOCK_HINT.encode() if isinstance(key, bytes) else key + LOCK_HINT


async def scan_statuses(
    client: Any,
    prefix: str,
    *,
    states: Collection[str] | None = None,
    route: str | None = None,
    scope: str | None = None,
    method: str | None = None,
    limit: int | None = None,
    count: int = 1000,
    progress: Callable[[int, int], None] | None = None,
) -> AsyncIterator[RecordStatus]:
    """Every record under ``prefix`` that passes the filters, page by page, at most ``limit``.

    ``progress`` is called after each SCAN page with the keys it looked at (``count``; SCAN's
    COUNT is a hint of that, matching or not) and the records it yielded.
    """
    if limit is not None and limit <= 0:
        return
    pattern, found = record_pattern(prefix), 0
    for target, reader in _targets(client):
        cluster = None if reader is client else client  # what a node redirects is read there
        cursor: Any = 0
        while True:
            cursor, keys = await client.execute_command(
                "SCAN", cursor, "MATCH", pattern, "COUNT", count, **target
            )
            if isinstance(cursor, dict):  # a cluster client answers {node: cursor}
                cursor = next(iter(cursor.values()))
            before = found
            if keys:
                for status in await read_statuses(reader, keys, cluster):
                    if wanted(status, states, route, scope, method):
                        yield status
                        found += 1
                        if limit is not None and found >= limit:
                            return
            if progress is not None:
                progress(count, found - before)
            if int(cursor) == 0:
                break
