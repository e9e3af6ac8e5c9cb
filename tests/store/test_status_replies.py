"""What the status readers make of replies no Redis sends (a proxy, a stranger on the port):
digits that ``str.isdigit()`` passes and ``int()`` refuses (``"²"``), a PTTL that is no
integer. ``store.records()``, ``idemkey stats`` and ``idemkey list`` read them as "not known",
never a ValueError; and where the one "a node redirected this key" check lives.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis.exceptions

from idemkey.store import status

SUPERSCRIPT_TWO = "\u00b2"  # str.isdigit() passes it; int() refuses it
PACKAGE = Path(__file__).resolve().parents[2] / "idemkey"


@pytest.mark.parametrize(
    "reply",
    [
        [SUPERSCRIPT_TWO.encode(), b"0"],
        [b"1700000000", SUPERSCRIPT_TWO.encode()],
        [SUPERSCRIPT_TWO, "0"],
        [b"1700000000", "\u0661\u0662"],  # Arabic-Indic digits: int() reads them, Redis never
        [b"9" * 5000, b"0"],  # past the 4 300 digits int() converts
        [b"", b"0"],
        [b"-1", b"0"],
    ],
)
def test_a_time_reply_int_refuses_is_no_clock(reply: list[object]) -> None:
    assert status.server_ms(reply) is None


@pytest.mark.parametrize(
    "reply",
    [
        (1_700_000_000, 123_456),  # redis-py's TIME callback
        [b"1700000000", b"123456"],  # glide: the reply as sent
        ["1700000000", "123456"],
    ],
)
def test_a_time_reply_is_the_servers_clock_in_ms(reply: object) -> None:
    assert status.server_ms(reply) == 1_700_000_000_123


@pytest.mark.parametrize(
    ("reply", "ms"),
    [(5000, 5000), (-1, -1), (-2, -2), (SUPERSCRIPT_TWO.encode(), -1), (b"5000", -1), (None, -1)],
)
def test_a_pttl_reply_that_is_no_integer_reads_as_no_ttl(reply: object, ms: int) -> None:
    """Redis answers PTTL with an integer; anything else is a TTL not known, not a record gone
    (-2) nor a ValueError."""
    assert status.pttl_ms(reply) == ms


class _Node:
    """A glide cluster client answering CLUSTER NODES with ``nodes``."""

    def __init__(self, nodes: str) -> None:
        self.nodes = nodes

    async def custom_command(self, command: list[str], route: object = None) -> bytes:
        assert command == ["CLUSTER", "NODES"]
        return self.nodes.encode()


def test_a_cluster_node_whose_port_int_refuses_is_no_primary() -> None:
    pytest.importorskip("glide", reason="valkey-glide is not installed (idemkey[glide])")
    from idemkey.store._glide import GlideClusterFacade

    slots = "connected 0-8191"
    nodes = (
        f"a1 127.0.0.1:7000@17000 myself,master - 0 0 1 {slots}\n"
        f"b2 127.0.0.1:70{SUPERSCRIPT_TWO}@17001 master - 0 0 2 connected 8192-16383\n"
        f"c3 127.0.0.1:{'9' * 5000}@17002 master - 0 0 3 connected 8192-16383\n"
    )
    facade = GlideClusterFacade(_Node(nodes))
    asyncio.run(facade.initialize())
    assert [node.name for node in facade.get_primaries()] == ["127.0.0.1:7000"]


# ---- a node's "not here (now)" ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("replies", "redirected"),
    [
        ((redis.exceptions.MovedError("3999 127.0.0.1:6381"), 5000), True),
        ((b"", redis.exceptions.AskError("3999 127.0.0.1:6381")), True),
        ((redis.exceptions.TryAgainError(),), True),
        ((redis.exceptions.ResponseError("WRONGTYPE"), -2), False),
        (([b"in_progress"], 5000), False),
        ((), False),
    ],
)
def test_a_redirect_is_a_cluster_reply_of_not_here(
    replies: tuple[Any, ...], redirected: bool
) -> None:
    assert status.redirected(*replies) is redirected


def test_the_redirect_check_has_one_home() -> None:
    """``store.records()`` (both readers) and ``idemkey stats`` ask ``status.redirected``:
    the set of redirect replies is named nowhere else but where it is defined."""
    naming = sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "_REDIRECTS" in path.read_text(encoding="utf-8")
    )
    assert naming == ["store/_durable.py", "store/status.py"]
