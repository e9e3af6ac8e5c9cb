"""Whom ``idemkey console`` answers, over plain HTTP with forged headers, against the console
run as a user runs it (``python -m idemkey console``) and the session's real Redis.

A foreign ``Host`` (a DNS rebinding, or a request to the wrong port) gets a 400 problem on every
route, reads included; a forget needs an ``Origin`` among the console's own (never one built from
the request's Host) and the token of this console process, which only its page carries. A
forget from the console is ``store.forget()``: with ``expired_grace`` on, the retry then runs
(the tombstone goes too). A port in use, and a non-loopback ``--host`` without
``--unsafe-expose``, are one line and exit status 2 before any banner.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import subprocess
import sys
from collections.abc import Callable

import pytest
import redis

from idemkey import Policy, RedisStore, guard
from idemkey.cli.demo_app import create_app as demo_app
from tests._servers import HOST, AppServer, free_port
from tests.cli.conftest import EVIL, ROOT

pytestmark = pytest.mark.redis


def ask(
    server: AppServer, path: str, host: str, *, method: str = "GET", **headers: str
) -> tuple[int, str]:
    """Send one request to ``server`` with the ``Host`` header ``host``: status and body."""
    connection = http.client.HTTPConnection(HOST, server.port, timeout=10)
    with contextlib.closing(connection):
        body = json.dumps(headers.pop("body", {})).encode() if method == "POST" else None
        sent = {"Host": host, "Content-Type": "application/json", **headers}
        connection.request(method, path, body=body, headers=sent)
        answer = connection.getresponse()
        return answer.status, answer.read().decode()


def own(server: AppServer) -> str:
    return f"127.0.0.1:{server.port}"


def token_of(server: AppServer) -> str:
    """The token the console's page carries (what the page's script sends with a forget)."""
    status, page = ask(server, "/", own(server))
    assert status == 200
    found = re.search(r'<meta name="idemkey-token" content="([^"]+)">', page)
    assert found, "the page carries no token"
    return found[1]


def released_with_a_step(store: RedisStore, key: str) -> str:
    with contextlib.suppress(RuntimeError), guard(store, key) as call:
        call.step("reserve", lambda: 1)
        raise RuntimeError("after a step")
    (status,) = store.records()
    return status.digest


@pytest.mark.parametrize("path", ["/", "/api/status", "/fragment", "/nowhere"])
def test_a_foreign_host_reads_nothing(
    console: Callable[..., AppServer], store: RedisStore, path: str
) -> None:
    digest = released_with_a_step(store, "order-21")
    server = console()
    for host in (f"{EVIL}:{server.port}", EVIL, f"127.0.0.1:{server.port + 1}", ""):
        status, body = ask(server, path, host)
        assert status == 400, (host, body)
        problem = json.loads(body)
        assert problem["status"] == 400
        assert "this console answers only to Host" in problem["detail"]
        assert digest not in body
        assert "reserve" not in body
    # Its own names still see it: the address it listens on, localhost, and [::1].
    for host in (own(server), f"localhost:{server.port}", f"[::1]:{server.port}"):
        status, body = ask(server, "/api/status", host)
        assert status == 200, (host, body)
        assert digest in body


def test_a_forget_needs_the_console_s_origin_and_token(
    console: Callable[..., AppServer], store: RedisStore, real_client: redis.Redis
) -> None:
    digest = released_with_a_step(store, "order-22")
    (shown,) = store.records()
    before = real_client.hgetall(f"{store.policy.prefix}:{{{digest}}}")
    server = console("--allow-forget")
    other = console("--allow-forget")  # another console process: another token
    token = token_of(server)
    assert token != token_of(other)
    home, evil = own(server), f"{EVIL}:{server.port}"
    body = {"digest": digest, "state": "released", "fence": str(shown.fence)}
    refused = [
        # (Host, Origin, token, expected status): the rebinding itself
        (evil, f"http://{evil}", token, 400),
        # the Origin must be the console's own, not the one the Host names
        (home, f"http://{evil}", token, 403),
        (home, None, token, 403),
        # the token of this console process, not the old constant header, not another's
        (home, f"http://{home}", None, 403),
        (home, f"http://{home}", token_of(other), 403),
        (home, f"http://{home}", token[:-1], 403),
    ]
    for host, origin, sent, expected in refused:
        headers = {"Origin": origin} if origin else {}
        headers.update({"X-Idemkey-Token": sent} if sent else {"X-Idemkey-Confirm": "forget"})
        status, answer = ask(server, "/api/forget", host, method="POST", body=body, **headers)
        assert status == expected, (host, origin, answer)
        assert json.loads(answer)["status"] == expected
    assert real_client.hgetall(f"{store.policy.prefix}:{{{digest}}}") == before
    # The page's own request: forgotten.
    headers = {"Origin": f"http://localhost:{server.port}", "X-Idemkey-Token": token}
    status, answer = ask(server, "/api/forget", home, method="POST", body=body, **headers)
    assert status == 200, answer
    assert json.loads(answer)["state"] == "released"
    assert list(store.records()) == []


def test_the_console_does_not_forget_a_completed_record_nor_its_tombstone(
    console: Callable[..., AppServer], real_client: redis.Redis, prefix: str
) -> None:
    """The page never offers a completed record (its answer is what a retry replays), so a
    forget of one is refused, whatever state it claims to have seen: the record and its
    tombstone stay, and the retry is replayed. ``idemkey forget`` is the way to forget one."""
    store = RedisStore(real_client, Policy(prefix=prefix, expired_grace=600.0))
    app = demo_app(store).test_client()
    charge = {"json": {"amount": 1000, "currency": "eur"}, "headers": {"Idempotency-Key": "k-1"}}
    assert app.post("/charges", **charge).status_code == 201
    (record,) = store.records()
    assert record.state == "complete"
    assert real_client.exists(f"{prefix}:{{{record.digest}}}:gone")  # the tombstone
    server = console("--allow-forget")
    assert f'data-forget="{record.digest}"' not in ask(server, "/", own(server))[1]
    headers = {"Origin": f"http://{own(server)}", "X-Idemkey-Token": token_of(server)}
    for state, expected in (("complete", 400), ("lapsed", 409), ("released", 409)):
        body = {"digest": record.digest, "state": state, "fence": ""}
        status, answer = ask(
            server, "/api/forget", own(server), method="POST", body=body, **headers
        )
        assert status == expected, answer
    assert (
        real_client.exists(f"{prefix}:{{{record.digest}}}", f"{prefix}:{{{record.digest}}}:gone")
        == 2
    )
    again = app.post("/charges", **charge)
    assert again.status_code == 201, again.get_data(as_text=True)
    assert app.get("/charges").get_json()["count"] == 1  # replayed, not run again
    store.close()


def run_console(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "idemkey", "--redis-url", redis_url, "console", *args]
    return subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, timeout=60, stdin=subprocess.DEVNULL
    )


def test_a_port_in_use_is_one_line_and_no_banner(redis_url: str) -> None:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_console(redis_url, "--port", str(port))
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""  # no "serving on" banner for a console that never served
    assert result.stderr == (
        f"idemkey console: port {port} on 127.0.0.1 is in use (another console?): choose "
        "another with --port\n"
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1"])
def test_a_non_loopback_host_is_refused_without_unsafe_expose(redis_url: str, host: str) -> None:
    port = free_port()
    result = run_console(redis_url, "--host", host, "--port", str(port))
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert "--unsafe-expose" in result.stderr
    assert "no authentication" in result.stderr
    with pytest.raises(ConnectionRefusedError), socket.create_connection((HOST, port), timeout=1):
        pass  # nothing listens


def test_unsafe_expose_says_it_is_unauthenticated_and_still_checks_the_host(
    console: Callable[..., AppServer],
) -> None:
    server = console("--host", "0.0.0.0", "--unsafe-expose", "--allow-host", "box.example")
    log = server.log_text()
    assert "WARNING: the console has no authentication" in log
    assert "unauthenticated" in log
    assert ask(server, "/api/status", own(server))[0] == 200
    assert ask(server, "/api/status", f"box.example:{server.port}")[0] == 200
    assert ask(server, "/api/status", f"{EVIL}:{server.port}")[0] == 400


@pytest.mark.parametrize("allow_forget", [True, False])
def test_a_route_added_later_gets_the_same_guard(store: RedisStore, allow_forget: bool) -> None:
    """The Host, Origin and token are asked by the middleware, for every method but GET and
    HEAD on every path, not by each route: a state-changing route added to the app later is
    guarded without a line of its own."""
    import asyncio

    import httpx
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from idemkey.console import create_app

    ran: list[str] = []

    def later(request: Request) -> PlainTextResponse:
        ran.append(request.method)
        return PlainTextResponse("done")

    token = "t" * 43
    app = create_app(store, port=8089, allow_forget=allow_forget, token=token)
    app.router.routes.append(Route("/api/later", later, methods=["GET", "POST", "PUT", "DELETE"]))
    home = "127.0.0.1:8089"

    async def drive() -> int:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{home}") as client:
            for method in ("POST", "PUT", "DELETE"):
                for headers in (
                    {},
                    {"X-Idemkey-Token": token},  # no Origin
                    {"Origin": f"http://{EVIL}:8089", "X-Idemkey-Token": token},
                    {"Origin": f"http://{home}"},  # no token
                    {"Origin": f"http://{home}", "X-Idemkey-Token": token[:-1]},
                ):
                    answer = await client.request(method, "/api/later", headers=headers)
                    assert answer.status_code == 403, (method, headers, answer.text)
                # A foreign Host, even with the right Origin and token: the rebinding itself.
                rebound = {"Host": f"{EVIL}:8089", "Origin": f"http://{home}"}
                rebound["X-Idemkey-Token"] = token
                answer = await client.request(method, "/api/later", headers=rebound)
                assert answer.status_code == 400, answer.text
            assert ran == []
            foreign = await client.get("/api/later", headers={"Host": f"{EVIL}:8089"})
            assert foreign.status_code == 400
            assert (await client.get("/api/later")).text == "done"  # a read needs the Host only
            own = {"Origin": "http://localhost:8089", "X-Idemkey-Token": token}
            return (await client.post("/api/later", headers=own)).status_code

    assert asyncio.run(drive()) == (200 if allow_forget else 403)
    assert ran == (["GET", "POST"] if allow_forget else ["GET"])
