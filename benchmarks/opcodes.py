"""Where a request's Python work goes: bytecodes run per function, load-independent.

::

    python -m benchmarks.opcodes wsgi.replay            # one path, its app alone beside it
    python -m benchmarks.opcodes wsgi.replay --top 10

``benchmarks.calls`` counts calls; a call's cost is the bytecode it runs, so this counts the
bytecodes of one request of a path (``sys.settrace`` opcode events, after a warm-up, on the
same in-process client) per Python function, and what idemkey adds over the path's app
alone (``<adapter>.plain``). Each function's own count, not its callees'. The profile of
every HTTP row in benchmarks/RESULTS.md ("Stop 48") is this tool's output.
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from benchmarks.calls import Request, _run, _stop_heartbeats, paths

__all__ = ["main", "opcodes"]


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


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.opcodes")
    p.add_argument("path", help="a path of benchmarks.calls (wsgi.replay, flask.first, ...)")
    p.add_argument("--top", type=int, default=40, help="functions listed (default 40)")
    args = p.parse_args(argv)
    table = paths()
    counts = opcodes(*table[args.path])
    plain = args.path.split(".")[0] + ".plain"
    alone = opcodes(*table[plain]) if plain in table and plain != args.path else None
    total = sum(counts.values())
    added = f", {total - sum(alone.values())} over {plain}" if alone is not None else ""
    print(f"{args.path}: {total} bytecodes per request{added}")
    for where, n in counts.most_common(args.top):
        print(f"{n:6d}  {where}")
    return _stop_heartbeats()


if __name__ == "__main__":
    raise SystemExit(main())
