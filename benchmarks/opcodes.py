"""Where a request's Python work goes: bytecodes run per function, load-independent.

::

    python -m benchmarks.opcodes wsgi.replay            # one path, its app alone beside it
    python -m benchmarks.opcodes wsgi.replay --top 10
    python -m benchmarks.opcodes asgi.replay.exchange   # the replay through short_probe's level

``benchmarks.calls`` counts calls; a call's cost is the bytecode it runs, so this counts the
bytecodes of one request of a path (``sys.settrace`` opcode events, after a warm-up, on the
same in-process client) per Python function, and what idemkey adds over the path's app
alone (``<adapter>.plain``). Each function's own count, not its callees'. The profile of
every HTTP row in benchmarks/RESULTS.md ("Stop 48") is this tool's output, and so are the
bytecodes of stop 49's ladder: ``wsgi.replay.<level>`` and ``asgi.replay.<level>`` are the
replay answered by ``benchmarks.short_probe`` at each of its levels (:func:`probe_paths`).
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from benchmarks.calls import (
    _LOOP,
    POLICY,
    AsyncFakeClient,
    FakeClient,
    Request,
    _call_asgi,
    _call_wsgi,
    _run,
    _stop_heartbeats,
    paths,
    plain_asgi,
    plain_wsgi,
)
from benchmarks.short_probe import LEVELS, asgi_probe, wsgi_probe
from idemkey import AsyncRedisStore, RedisStore

__all__ = ["main", "opcodes", "probe_paths"]


def opcodes(request: Request, is_async: bool) -> collections.Counter[str]:
    """Bytecodes one request runs, per Python function (``qualname (file)``), after 50 warm."""
    _run(request, is_async, range(10**6, 10**6 + 50), lambda: None)
    counts: collections.Counter[str] = collections.Counter()

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[f"{code.co_qualname} ({code.co_filename.rsplit('/', 1)[-1]})"] += 1
        return trace

    def toggle() -> None:
        sys.settrace(None if sys.gettrace() is trace else trace)

    _run(request, is_async, range(1), toggle)
    del counts[f"{toggle.__qualname__} ({__file__.rsplit('/', 1)[-1]})"]
    return counts


def app_alone(path: str) -> str:
    """The path of the same adapter's app without idemkey: ``wsgi.replay`` -> ``wsgi.plain``."""
    return path.split(".")[0] + ".plain"


def added_over_app(table: dict[str, tuple[Request, bool]], path: str) -> int:
    """idemkey's bytecodes per request of ``path`` over its app alone (:func:`app_alone`)."""
    return sum(opcodes(*table[path]).values()) - sum(opcodes(*table[app_alone(path)]).values())


def probe_paths() -> dict[str, tuple[Request, bool]]:
    """``wsgi.replay.<level>`` and ``asgi.replay.<level>``: the replay of ``benchmarks.calls``
    answered by the short-path probe at each of its levels, the middleware behind it."""
    from idemkey.adapters.asgi import IdempotencyMiddleware as AsgiMiddleware
    from idemkey.adapters.wsgi import IdempotencyMiddleware as WsgiMiddleware

    policy = POLICY
    seeded = FakeClient()
    _call_wsgi(WsgiMiddleware(plain_wsgi, RedisStore(seeded, policy)), "seed")
    aseeded = AsyncFakeClient()
    aseed = AsgiMiddleware(plain_asgi, AsyncRedisStore(aseeded, policy))
    _LOOP.run_until_complete(_call_asgi(aseed, "seed"))
    out: dict[str, tuple[Request, bool]] = {}
    for level in LEVELS:
        store = RedisStore(FakeClient(seeded.completed), policy)
        wsgi = wsgi_probe(store, WsgiMiddleware(plain_wsgi, store), level)
        astore = AsyncRedisStore(AsyncFakeClient(aseeded.completed), policy)
        asgi = asgi_probe(astore, AsgiMiddleware(plain_asgi, astore), level)

        async def asgi_replay(i: int, app: Any = asgi) -> None:
            await _call_asgi(app, "seed")

        out[f"wsgi.replay.{level}"] = (lambda i, app=wsgi: _call_wsgi(app, "seed"), False)
        out[f"asgi.replay.{level}"] = (asgi_replay, True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.opcodes")
    p.add_argument(
        "path", help="a path of benchmarks.calls (wsgi.replay, flask.first, ...) or of probe_paths"
    )
    p.add_argument("--top", type=int, default=40, help="functions listed (default 40)")
    args = p.parse_args(argv)
    table = paths()
    table.update(probe_paths())
    counts = opcodes(*table[args.path])
    total, plain = sum(counts.values()), app_alone(args.path)
    over = plain in table and plain != args.path
    added = f", {added_over_app(table, args.path)} over {plain}" if over else ""
    print(f"{args.path}: {total} bytecodes per request{added}")
    for where, n in counts.most_common(args.top):
        print(f"{n:6d}  {where}")
    return _stop_heartbeats()


if __name__ == "__main__":
    raise SystemExit(main())
