"""Load-independent cost per request: Python calls, C calls, distinct functions, peak memory.

::

    python -m benchmarks.calls              # a table: one row per path
    python -m benchmarks.calls --run guard.replay -n 2000   # just run it (for callgrind)

The box that runs the timed suite is often busy; these counts are not. Cold cost (a request
between network calls, caches cold) tracks the Python calls made, the objects built and the
distinct code touched, so this counts them, per request, after a warm-up:

* ``py``: Python function calls (``sys.setprofile`` "call" events; a generator or coroutine
  resuming counts as a call), ``c``: calls into C functions (builtins, methods, msgspec...),
* ``funcs``: distinct Python functions one request runs (code to fetch when cold),
* ``peak``: tracemalloc peak bytes above the start of one request (objects alive at once),
* with ``--callgrind``: CPU instructions per request (valgrind; slow, but exact under load).

Every path runs against an in-process client that answers each script at once (no Redis).
``*.plain`` rows are the app alone; ``+py`` is what idemkey adds over it. Only the public API
is used, so the same file measures another checkout:
``PYTHONPATH=/path/to/checkout python /path/to/benchmarks/calls.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import os
import re
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

from idemkey import AsyncRedisStore, Policy, RedisStore, aguard, guard
from idemkey.store import SCRIPTS

__all__ = ["POLICY", "main", "measure"]

PAYLOAD = b'{"invoice":"inv_42","amount":1999,"currency":"eur","customer":"cus_9"}'
RESULT: dict[str, Any] = {"id": "ch_3Mtw", "status": "succeeded", "amount": 1999}
BODY = b'{"id":"ch_3Mtw","status":"succeeded","amount":1999}'
_HEADERS = [("Content-Type", "application/json"), ("Content-Length", str(len(BODY)))]
_SHA = {hashlib.sha1(text.encode()).hexdigest(): name for name, text in SCRIPTS.items()}


class _Encoder:
    decode_responses = False


class _Script:
    def __init__(self, text: str) -> None:
        self.sha = hashlib.sha1(text.encode()).hexdigest()


class FakeClient:
    """Answers every script at once: a claim wins (``stored`` None) or replays ``stored``.
    Keeps the last value a complete stored, to replay it."""

    def __init__(self, stored: bytes | None = None) -> None:
        self.stored = stored
        self.completed: bytes | None = None

    def get_encoder(self) -> _Encoder:
        return _Encoder()

    def register_script(self, text: str) -> _Script:
        return _Script(text)

    def execute_command(self, *args: Any) -> object:
        name = _SHA[args[1]]
        if name == "claim":
            return [1, 1, 0] if self.stored is None else [2, self.stored]
        if name == "complete":
            self.completed = args[4 + int(args[2])]  # EVALSHA sha numkeys *keys owner resp
        return 1


class AsyncFakeClient(FakeClient):
    async def execute_command(self, *args: Any) -> object:  # type: ignore[override]
        return FakeClient.execute_command(self, *args)


def _environ(key: str) -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "POST", "SCRIPT_NAME": "", "PATH_INFO": "/orders",
        "QUERY_STRING": "", "SERVER_NAME": "bench", "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1", "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(PAYLOAD)), "HTTP_IDEMPOTENCY_KEY": key,
        "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(PAYLOAD),
        "wsgi.errors": sys.stderr, "wsgi.multithread": False, "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }  # fmt: skip


def _scope(key: str) -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/orders", "raw_path": b"/orders", "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 50000), "server": ("bench", 80),
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(PAYLOAD)), (b"idempotency-key", key.encode())],
    }  # fmt: skip


def _start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
    return None


def _call_wsgi(app: Any, key: str) -> None:
    result = app(_environ(key), _start_response)
    for _ in result:
        pass
    close = getattr(result, "close", None)
    if close is not None:
        close()


_START = {"type": "http.response.start", "status": 201,
          "headers": [(b"content-type", b"application/json"),
                      (b"content-length", b"%d" % len(BODY))]}  # fmt: skip
_BODY = {"type": "http.response.body", "body": BODY, "more_body": False}
_REQUEST = {"type": "http.request", "body": PAYLOAD, "more_body": False}


def plain_wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    start_response("201 Created", _HEADERS)
    return [BODY]


async def plain_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send(_START)
    await send(_BODY)


async def _call_asgi(app: Any, key: str) -> None:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return _REQUEST

    async def send(message: dict[str, Any]) -> None:
        pass

    await app(_scope(key), receive, send)


Request = Callable[[int], Any]  # request i (a coroutine function for async paths)
# One loop for every async path: the async stores' heartbeats live in it.
_LOOP = asyncio.new_event_loop()


def _flask(store: RedisStore) -> tuple[Any, Any]:
    from flask import Flask, request

    from idemkey.adapters.flask import Idemkey

    app = Flask("idemkey_calls")
    idem = Idemkey(app, store=store)

    def view() -> tuple[bytes, int, dict[str, str]]:
        request.get_data()
        return BODY, 201, {"Content-Type": "application/json"}

    app.add_url_rule("/orders", "guarded", idem.idempotent(view), methods=["POST"])
    plain = Flask("idemkey_calls_plain")
    plain.add_url_rule("/orders", "plain", view, methods=["POST"])
    return plain, app


#: The policy of every path (and of ``benchmarks.opcodes``' probe paths).
POLICY = Policy(prefix="calls", ttl=900.0, lease=30.0)


def paths() -> dict[str, tuple[Request, bool]]:
    """name -> (request i, is_async)."""
    from idemkey.adapters.asgi import IdempotencyMiddleware as AsgiMiddleware
    from idemkey.adapters.wsgi import IdempotencyMiddleware as WsgiMiddleware

    policy = POLICY

    def sync_pair(wrap: Callable[[RedisStore], Any]) -> tuple[Any, Any]:
        """(first app, replay app): the replay store replays what the first one stored."""
        first_client = FakeClient()
        first = wrap(RedisStore(first_client, policy))
        _call_wsgi(first, "seed")
        replay = wrap(RedisStore(FakeClient(first_client.completed), policy))
        return first, replay

    out: dict[str, tuple[Request, bool]] = {}
    first_store = RedisStore(FakeClient(), policy)
    with guard(first_store, "seed", payload=PAYLOAD) as seed:
        seed.save(RESULT)
    replay_store = RedisStore(FakeClient(first_store.client.completed), policy)
    stored = first_store.client.completed
    afirst = AsyncRedisStore(AsyncFakeClient(), policy)
    areplay = AsyncRedisStore(AsyncFakeClient(stored), policy)

    def guard_first(i: int) -> None:
        with guard(first_store, f"order:{i}", payload=PAYLOAD) as call:
            call.save(RESULT)

    def guard_replay(i: int) -> None:
        with guard(replay_store, "replay", payload=PAYLOAD) as call:
            call.result  # noqa: B018

    async def aguard_first(i: int) -> None:
        async with aguard(afirst, f"order:{i}", payload=PAYLOAD) as call:
            call.save(RESULT)

    async def aguard_replay(i: int) -> None:
        async with aguard(areplay, "replay", payload=PAYLOAD) as call:
            call.result  # noqa: B018

    out["guard.first"] = (guard_first, False)
    out["guard.replay"] = (guard_replay, False)
    out["aguard.first"] = (aguard_first, True)
    out["aguard.replay"] = (aguard_replay, True)

    wsgi_first, wsgi_replay = sync_pair(lambda s: WsgiMiddleware(plain_wsgi, s))
    out["wsgi.plain"] = (lambda i: _call_wsgi(plain_wsgi, f"k{i}"), False)
    out["wsgi.first"] = (lambda i: _call_wsgi(wsgi_first, f"k{i}"), False)
    out["wsgi.replay"] = (lambda i: _call_wsgi(wsgi_replay, "seed"), False)

    asgi_first_client = AsyncFakeClient()
    asgi_first = AsgiMiddleware(plain_asgi, AsyncRedisStore(asgi_first_client, policy))
    _LOOP.run_until_complete(_call_asgi(asgi_first, "seed"))
    asgi_replay = AsgiMiddleware(
        plain_asgi, AsyncRedisStore(AsyncFakeClient(asgi_first_client.completed), policy)
    )

    async def asgi_plain(i: int) -> None:
        await _call_asgi(plain_asgi, f"k{i}")

    async def asgi_first_run(i: int) -> None:
        await _call_asgi(asgi_first, f"k{i}")

    async def asgi_replay_run(i: int) -> None:
        await _call_asgi(asgi_replay, "seed")

    out["asgi.plain"] = (asgi_plain, True)
    out["asgi.first"] = (asgi_first_run, True)
    out["asgi.replay"] = (asgi_replay_run, True)

    try:
        flask_plain, _ = _flask(RedisStore(FakeClient(), policy))
        flask_first, flask_replay = sync_pair(lambda s: _flask(s)[1])
    except ImportError:
        return out
    out["flask.plain"] = (lambda i: _call_wsgi(flask_plain, f"k{i}"), False)
    out["flask.first"] = (lambda i: _call_wsgi(flask_first, f"k{i}"), False)
    out["flask.replay"] = (lambda i: _call_wsgi(flask_replay, "seed"), False)
    return out


class _Counter:
    def __init__(self) -> None:
        self.py = self.c = 0
        self.codes: set[Any] = set()

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.py += 1
            self.codes.add(frame.f_code)
        elif event == "c_call":
            self.c += 1


def _run(request: Request, is_async: bool, indices: range, hook: Callable[[], Any]) -> Any:
    """Run requests ``indices`` between ``hook()`` calls: hook() before, hook() after."""
    if not is_async:
        hook()
        for i in indices:
            request(i)
        return hook()

    async def many() -> Any:
        hook()
        for i in indices:
            await request(i)
        return hook()

    return _LOOP.run_until_complete(many())


def measure(request: Request, is_async: bool, n: int = 200) -> dict[str, float]:
    """Per request: Python calls, C calls, distinct Python functions, tracemalloc peak bytes."""
    _run(request, is_async, range(10**6, 10**6 + 20), lambda: None)  # warm: imports, caches
    counter = _Counter()

    def toggle() -> None:
        sys.setprofile(None if sys.getprofile() is counter else counter)

    _run(request, is_async, range(n), toggle)
    py, c = counter.py / n, counter.c / n
    one = _Counter()

    def toggle_one() -> None:
        sys.setprofile(None if sys.getprofile() is one else one)

    _run(request, is_async, range(n, n + 1), toggle_one)
    tracemalloc.start()
    _run(request, is_async, range(2 * n, 2 * n + 3), lambda: None)
    peaks = []
    for i in range(5):
        marks: list[int] = []

        def mark(marks: list[int] = marks) -> None:
            if not marks:
                tracemalloc.reset_peak()
                marks.append(tracemalloc.get_traced_memory()[0])
            else:
                marks.append(tracemalloc.get_traced_memory()[1] - marks[0])

        _run(request, is_async, range(3 * n + i, 3 * n + i + 1), mark)
        peaks.append(marks[1])
    tracemalloc.stop()
    return {"py": py, "c": c, "funcs": len(one.codes), "peak": min(peaks)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.calls")
    p.add_argument("-n", type=int, default=200, help="requests counted per path")
    p.add_argument("--run", metavar="PATH", help="only run PATH n times, count nothing")
    p.add_argument("--detail", metavar="PATH", help="list the calls one request of PATH makes")
    p.add_argument(
        "--callgrind",
        action="store_true",
        help="instructions per request instead, from two valgrind runs per path",
    )
    p.add_argument("paths", nargs="*", help="paths to measure (default: all)")
    args = p.parse_args(argv)
    table = paths()
    if args.run:
        request, is_async = table[args.run]
        _run(request, is_async, range(args.n), lambda: None)
        return _stop_heartbeats()
    if args.callgrind:
        for name in args.paths or table:
            print(f"{name:14s} {_instructions(name, args.n):9.0f} instructions per request")
        return _stop_heartbeats()
    if args.detail:
        request, is_async = table[args.detail]
        _run(request, is_async, range(10**6, 10**6 + 20), lambda: None)
        events: list[str] = []

        def trace(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                code = frame.f_code
                where = f"{code.co_filename.rsplit('/', 2)[-2:][-1]}:{code.co_firstlineno}"
                events.append(f"{code.co_qualname} ({where})")
            elif event == "c_call":
                events.append(f"  [C] {getattr(arg, '__qualname__', arg)}")

        def toggle() -> None:
            sys.setprofile(None if sys.getprofile() is trace else trace)

        _run(request, is_async, range(1), toggle)
        print("\n".join(events))
        return _stop_heartbeats()
    plain = {}
    print(f"{'path':14s} {'py':>6s} {'c':>6s} {'funcs':>6s} {'peak B':>7s} {'+py':>6s} {'+c':>6s}")
    for name, (request, is_async) in table.items():
        if args.paths and name not in args.paths and not name.endswith(".plain"):
            continue
        m = measure(request, is_async, args.n)
        base = plain.get(name.split(".")[0])
        if name.endswith(".plain"):
            plain[name.split(".")[0]] = m
        extra = f" {m['py'] - base['py']:6.0f} {m['c'] - base['c']:6.0f}" if base else ""
        if args.paths and name not in args.paths:
            continue
        print(f"{name:14s} {m['py']:6.0f} {m['c']:6.0f} {m['funcs']:6d} {m['peak']:7d}{extra}")
    return _stop_heartbeats()


def _instructions(name: str, n: int) -> float:
    """Instructions per request of path ``name`` (callgrind), load-independent: two runs of
    the whole script, ``n`` and ``n + 1000`` requests, so start-up cancels out."""
    counts = []
    for requests in (n, n + 1000):
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out",
                 sys.executable, __file__, "--run", name, "-n", str(requests)],
                capture_output=True, text=True, check=True,
                env={**os.environ, "PYTHONHASHSEED": "0"},  # dict probes alike in every run
            ).stderr  # fmt: skip
        counts.append(int(re.search(r"Collected : (\d+)", out).group(1)))  # type: ignore[union-attr]
    return (counts[1] - counts[0]) / 1000


def _stop_heartbeats() -> int:
    tasks = asyncio.all_tasks(_LOOP)
    for task in tasks:
        task.cancel()
    _LOOP.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
