"""The default scope's cache of request shapes (``idemkey.http._scope``) stays small in bytes.

Each entry is keyed by the request's own header names, which the client chooses: 1024 entries
of 95 made-up names of 8 KB each would pin most of a gigabyte in a worker. A shape of too many
names, or of too many characters, is never kept: it is classified on every request, and its
scope is the one a kept shape of the same credentials gets.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from idemkey.adapters._environ import request_of
from idemkey.http import Headers, Request, _scope
from idemkey.http._scope import credential_scope

# What the tables may hold once one is full of shapes at both bounds (128 names, 4 KiB), every
# name a credential (the most a shape keeps): measured 37.5 MiB for field names, 35.5 MiB for
# environ keys (CPython 3.11). Unbounded, 1024 shapes of 95 names of 8 KB: about 760 MiB.
WORST_CASE_BYTES = 40 * 2**20


@pytest.fixture
def tables(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], dict[str, Any]]:
    """Empty tables for this test: the process's own stay as they were."""
    fields: dict[str, Any] = {}
    environ: dict[str, Any] = {}
    monkeypatch.setattr(_scope, "_FIELD_SHAPES", fields)
    monkeypatch.setattr(_scope, "_ENVIRON_SHAPES", environ)
    return fields, environ


def kept_bytes(*roots: object) -> int:
    """The bytes of every object the tables reach: dicts, shape tuples, names, plans."""
    seen: set[int] = set()
    stack = list(roots)
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack += obj.keys()
            stack += obj.values()
        elif isinstance(obj, tuple):
            stack += obj
    return total


CREDENTIALS = [("Authorization", "Bearer alice"), ("X-Auth-Token", "t1")]


def request_with(spelling: str, names: list[str], value: str = "v") -> Request:
    """POST /charges with the key, CREDENTIALS and a header of each of ``names``."""
    headers = [("Idempotency-Key", "k"), *CREDENTIALS, *((name, value) for name in names)]
    if spelling == "fields":
        return Request("POST", "/charges", "", Headers(headers))
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/charges", "CONTENT_TYPE": "a/b"}
    environ |= {"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers}
    return request_of(environ)


@pytest.mark.parametrize("spelling", ["fields", "environ"])
@pytest.mark.parametrize(
    ("count", "length"),
    [(95, 8100), (200, 12)],  # long names (gunicorn's limits: 100 fields, 8190-byte lines); many
    ids=["long-names", "many-names"],
)
def test_large_shapes_are_never_kept_and_keep_their_scope(
    tables: tuple[dict[str, Any], dict[str, Any]], spelling: str, count: int, length: int
) -> None:
    expected = credential_scope(request_with(spelling, []))  # a small shape: kept
    table = tables[spelling == "environ"]
    assert len(table["Idempotency-Key"]) == 1
    for shape in range(40):
        names = [f"X-{shape}-{index}-".ljust(length, "A") for index in range(count)]
        assert credential_scope(request_with(spelling, names)) == expected
        # The same credentials among those names: still the same scope, still not kept.
        assert credential_scope(request_with(spelling, names[::-1])) == expected
    assert kept_bytes(*tables) < 16 * 2**10
    # Another credential among the made-up names is still digested.
    names = [f"X-Big-{index}-".ljust(8100, "A") for index in range(94)] + ["X-Session-Id"]
    assert credential_scope(request_with(spelling, names)) != expected


@pytest.mark.parametrize("spelling", ["fields", "environ"])
def test_a_full_table_of_shapes_at_the_bounds_stays_under_its_stated_size(
    tables: tuple[dict[str, Any], dict[str, Any]], spelling: str
) -> None:
    # Every name reads as a credential ("token"), so every entry keeps its longest plan.
    names = _scope._MAX_SHAPE_NAMES - len(CREDENTIALS) - 1 - (spelling == "environ") * 3
    length = _scope._MAX_SHAPE_CHARS // _scope._MAX_SHAPE_NAMES - (spelling == "environ") * 5
    expected = {}
    for shape in range(_scope._MAX_SHAPES + 50):
        request = request_with(
            spelling, [f"X-Token-{shape}-{index}-".ljust(length, "a") for index in range(names)]
        )
        raw = tuple(request.headers.raw_names())
        assert len(raw) <= _scope._MAX_SHAPE_NAMES
        assert sum(map(len, raw)) <= _scope._MAX_SHAPE_CHARS
        expected[shape] = credential_scope(request)
    table = tables[spelling == "environ"]["Idempotency-Key"]
    assert len(table) == _scope._MAX_SHAPES  # every shape within the bounds kept, while room
    assert kept_bytes(*tables) < WORST_CASE_BYTES
    # A kept shape gives the scope it gave when it was classified.
    first = [f"X-Token-0-{index}-".ljust(length, "a") for index in range(names)]
    assert credential_scope(request_with(spelling, first)) == expected[0]
