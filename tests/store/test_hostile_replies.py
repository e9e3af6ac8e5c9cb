"""A server on the store's address that answers idemkey's scripts with what no Redis sends for
them (a hostile proxy, a broken server): a claim reply whose fence or lease time is no number,
a WAIT answered with a status instead of a replica count. Each must be a StoreError (a 503
``store_unavailable`` through an adapter, the handler not run), never a bare ValueError or
TypeError (an internal error: a 500 and a traceback).

The server is the command-line tests' scripted RESP server (tests/cli/test_hostile_redis.py),
answering each command from a table, and HELLO 3 as Redis does; the stores run on redis-py,
sync and asyncio, and on valkey-glide, each on RESP2 and on RESP3 (redis-py 8.2's default and
glide's), which has replies of its own for a number that is none: a double (``,1.5``, which
int() truncated: the handler ran on a fence 1), a null, a map.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio

from idemkey import AsyncRedisStore, Policy, RedisStore, aguard, guard
from idemkey.adapters.asgi import IdempotencyMiddleware, Receive, Scope, Send
from idemkey.errors import StoreError
from idemkey.policy import Replicas
from idemkey.store import SCRIPTS
from tests.cli.test_hostile_redis import FakeRedis, Replies, fake_redis, info  # noqa: F401 (fixture)

CLAIM_SHA = hashlib.sha1(SCRIPTS["claim"].encode()).hexdigest().encode()

#: claim.lua's replies with a number that is none: ``{tag, ...}`` as RESP2 arrays.
HOSTILE_CLAIMS = {
    "in flight, its lease a word": b"*2\r\n:3\r\n$1\r\nx\r\n",
    "in flight, its lease a list": b"*2\r\n:3\r\n*0\r\n",
    "in flight, its lease past a float": b"*2\r\n:3\r\n$400\r\n" + b"9" * 400 + b"\r\n",
    "claimed, its fence a word": b"*3\r\n:1\r\n$1\r\nx\r\n:0\r\n",
    "claimed, its fence a list": b"*3\r\n:1\r\n*0\r\n:0\r\n",
    "claimed with a step, its fence a word": (
        b"*5\r\n:1\r\n$1\r\nx\r\n:0\r\n$4\r\nstep\r\n$2\r\nok\r\n"
    ),
}
#: claim.lua's replies with a number that is none in RESP3's types, which only a RESP3 client
#: reads (a RESP2 client refuses the type byte itself: a connection error).
RESP3_CLAIMS = {
    "claimed, its fence a double": b"*3\r\n:1\r\n,1.5\r\n:0\r\n",
    "claimed, its fence a whole double": b"*3\r\n:1\r\n,7\r\n:0\r\n",
    "claimed with a step, its fence a double": (
        b"*5\r\n:1\r\n,1.5\r\n:0\r\n$4\r\nstep\r\n$2\r\nok\r\n"
    ),
    "claimed, its fence a null": b"*3\r\n:1\r\n_\r\n:0\r\n",
    "claimed, its fence a map": b"*3\r\n:1\r\n%0\r\n:0\r\n",
    "claimed, its fence a boolean": b"*3\r\n:1\r\n#t\r\n:0\r\n",  # an int to int()
    "in flight, its lease a double": b"*2\r\n:3\r\n,2.5\r\n",
    "in flight, its lease an infinite double": b"*2\r\n:3\r\n,inf\r\n",
    "in flight, its lease a double that is no number": b"*2\r\n:3\r\n,nan\r\n",
    "in flight, its lease a big number past a float": b"*2\r\n:3\r\n(" + b"9" * 400 + b"\r\n",
}
#: What Redis 7 answers HELLO 3: a map, with the protocol the client asked for.
HELLO_3 = (
    b"%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$6\r\n7.0.15\r\n"
    b"$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:1\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n"
    b"$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n"
)
#: What claim.lua answers a fresh claim (fence 7), for the WAIT test.
CLAIMED = b"*3\r\n:1\r\n:7\r\n:0\r\n"


def scripts_answering(claim: bytes, **overrides: Callable[[list[bytes]], bytes]) -> Replies:
    """A server whose claim script answers ``claim`` and every other script 1, that takes the
    commands redis-py and glide send as they connect (HELLO 3 on RESP3), and calls itself a
    master."""
    replies: Replies = {
        b"HELLO": lambda args: HELLO_3,
        b"EVALSHA": lambda args: claim if args[1] == CLAIM_SHA else b":1\r\n",
        b"CLIENT": lambda args: b"+OK\r\n",  # SETINFO (glide gives up on an error)
        b"INFO": lambda args: info(),  # glide looks for the primary
    }
    replies.update({name.upper().encode(): reply for name, reply in overrides.items()})
    return replies


def _port(server: FakeRedis) -> int:
    return int(server.url.rsplit(":", 1)[1].split("/")[0])


def _sync_client(kind: str, server: FakeRedis) -> redis.Redis:
    if kind == "redis-py":
        return redis.Redis(port=_port(server), protocol=2, socket_timeout=5)
    assert kind == "redis-py RESP3"
    return redis.Redis(port=_port(server), socket_timeout=5)  # the default protocol


async def _async_client(kind: str, server: FakeRedis) -> Any:
    if kind == "redis-py":
        return redis.asyncio.Redis(port=_port(server), protocol=2, socket_timeout=5)
    if kind == "redis-py RESP3":
        return redis.asyncio.Redis(port=_port(server), socket_timeout=5)  # the default protocol
    glide = pytest.importorskip("glide", reason="valkey-glide is not installed")
    resp2 = {"protocol": glide.ProtocolVersion.RESP2} if kind == "glide" else {}
    config = glide.GlideClientConfiguration(
        [glide.NodeAddress("127.0.0.1", _port(server))], request_timeout=5000, **resp2
    )
    return await glide.GlideClient.create(config)


@pytest.fixture
async def async_stores() -> AsyncIterator[Callable[..., Any]]:
    """``await make(kind, server, policy)``: an AsyncRedisStore on redis.asyncio or glide,
    closed with its client after the test."""
    made: list[tuple[AsyncRedisStore, Any]] = []

    async def make(kind: str, server: FakeRedis, policy: Policy) -> AsyncRedisStore:
        client = await _async_client(kind, server)
        made.append((AsyncRedisStore(client, policy), client))
        return made[-1][0]

    yield make
    for store, client in made:
        await store.aclose()
        await (client.aclose() if isinstance(client, redis.asyncio.Redis) else client.close())


#: glide's Rust core aborts the process (not an error: the whole worker dies) on a RESP3 big
#: number in reply to EVALSHA, an upstream bug no store can catch; its other replies run.
GLIDE_ABORTS_ON = {"in flight, its lease a big number past a float"}


def _cases(clients: list[str]) -> list[Any]:
    """(client, reply) for each client and each reply it reads: RESP3's types on RESP3 only."""
    return [
        pytest.param(kind, reply, id=f"{kind}-{name}")
        for kind in clients
        for name, reply in (
            {**HOSTILE_CLAIMS, **RESP3_CLAIMS} if kind.endswith("RESP3") else HOSTILE_CLAIMS
        ).items()
        if not (kind == "glide RESP3" and name in GLIDE_ABORTS_ON)
    ]


SYNC_CASES = _cases(["redis-py", "redis-py RESP3"])
ASYNC_CASES = _cases(["redis-py", "redis-py RESP3", "glide", "glide RESP3"])


@pytest.mark.parametrize(("kind", "reply"), SYNC_CASES)
def test_a_claim_reply_with_no_number_is_a_store_error_in_guard(
    fake_redis: Callable[[Replies], FakeRedis],  # noqa: F811
    kind: str,
    reply: bytes,
) -> None:
    server = fake_redis(scripts_answering(reply))
    client = _sync_client(kind, server)
    store = RedisStore(client, Policy(prefix="hostile"))
    ran = []
    try:
        with (
            pytest.raises(StoreError, match="unexpected reply from the claim script"),
            guard(store, "k", payload=b"p"),
        ):
            ran.append(True)
    finally:
        store.close()
        client.close()
    assert ran == []


@pytest.mark.parametrize(("kind", "reply"), ASYNC_CASES)
async def test_a_claim_reply_with_no_number_is_a_store_error_in_aguard(
    fake_redis: Callable[[Replies], FakeRedis],  # noqa: F811
    async_stores: Callable[..., Any],
    reply: bytes,
    kind: str,
) -> None:
    store = await async_stores(kind, fake_redis(scripts_answering(reply)), Policy(prefix="hostile"))
    ran = []
    with pytest.raises(StoreError, match="unexpected reply from the claim script"):
        async with aguard(store, "k", payload=b"p"):
            ran.append(True)
    assert ran == []


async def _charge(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"charged"})
    raise AssertionError("the handler ran on a claim nobody made")


@pytest.mark.parametrize(("kind", "reply"), ASYNC_CASES)
async def test_a_claim_reply_with_no_number_is_a_503_through_the_asgi_middleware(
    fake_redis: Callable[[Replies], FakeRedis],  # noqa: F811
    async_stores: Callable[..., Any],
    reply: bytes,
    kind: str,
) -> None:
    policy = Policy(prefix="hostile", scope=lambda request: "tenant")
    store = await async_stores(kind, fake_redis(scripts_answering(reply)), policy)
    app = IdempotencyMiddleware(_charge, store)
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        answer = await client.post("/charges", content=b"{}", headers={"Idempotency-Key": "k-1"})
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert json.loads(answer.content)["code"] == "store_unavailable"


# ---- WAIT answered with no replica count ------------------------------------------------------


def test_a_wait_reply_that_is_no_count_is_a_store_error_and_the_claim_is_released(
    fake_redis: Callable[[Replies], FakeRedis],  # noqa: F811
) -> None:
    server = fake_redis(scripts_answering(CLAIMED, wait=lambda args: b"+OK\r\n"))
    sent: list[bytes] = []
    evalsha = server.replies[b"EVALSHA"]
    server.replies[b"EVALSHA"] = lambda args: sent.append(args[1]) or evalsha(args)
    client = redis.Redis(port=_port(server), protocol=2, socket_timeout=5)
    store = RedisStore(client, Policy(prefix="hostile", durability=Replicas(1, 0.1)))
    ran = []
    try:
        with pytest.raises(StoreError, match="WAIT"), guard(store, "k", payload=b"p"):
            ran.append(True)
    finally:
        store.close()
        client.close()
    assert ran == []
    release_sha = hashlib.sha1(SCRIPTS["release"].encode()).hexdigest().encode()
    assert sent == [CLAIM_SHA, release_sha]  # claimed, then given back: not held for a lease


async def test_a_wait_reply_that_is_no_count_is_a_store_error_in_aguard(
    fake_redis: Callable[[Replies], FakeRedis],  # noqa: F811
    async_stores: Callable[..., Any],
) -> None:
    """On redis.asyncio: glide refuses Policy.durability (WAIT would block its connection)."""
    server = fake_redis(scripts_answering(CLAIMED, wait=lambda args: b"+OK\r\n"))
    policy = Policy(prefix="hostile", durability=Replicas(1, 0.1))
    store = await async_stores("redis-py", server, policy)
    ran = []
    with pytest.raises(StoreError, match="WAIT"):
        async with aguard(store, "k", payload=b"p"):
            ran.append(True)
    assert ran == []
