"""``python -m benchmarks.opcodes`` profiles one request of a path by the bytecodes each
function runs: the same count every time (it is the note's profile of each HTTP row), and
what idemkey runs, not the app alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.calls import paths
from benchmarks.opcodes import main, opcodes
from idemkey import _core

ROOT = Path(__file__).resolve().parents[2]


def test_a_replay_is_profiled_the_same_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # Owner tokens come from a pool refilled every 64 claims: a measurement (50 warm, 1
    # counted) whose counted claim emptied it counted the refill (697 bytecodes more),
    # depending on how many claims this worker's earlier tests made. A pool of 100: the
    # counted claims never refill.
    monkeypatch.setattr(_core, "_owners", [f"{n:032x}" for n in range(100)])
    table = paths()
    first, again = opcodes(*table["wsgi.replay"]), opcodes(*table["wsgi.replay"])
    assert first == again
    alone = opcodes(*table["wsgi.plain"])
    assert "Exchange.decide (_exchange.py)" in first
    assert "Exchange.decide (_exchange.py)" not in alone
    assert sum(first.values()) > sum(alone.values())


def test_the_table_names_the_path_and_what_idemkey_adds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["asgi.replay", "--top", "5"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("asgi.replay: "), out[0]
    assert "over asgi.plain" in out[0], out[0]
    assert len(out) == 6, out
    assert all(line.split()[0].isdigit() for line in out[1:]), out


# The probe levels and the middleware, each request's bytecodes by function, counted in a fresh
# interpreter as the budgets are: in a worker that ran other tests first, one level once ran a
# first use of some process-wide state (1 946 bytecodes at the store level, 1 350 at the next).
_LEVELS = """
import json, sys
from benchmarks.calls import paths
from benchmarks.opcodes import opcodes, probe_paths
from benchmarks.short_probe import LEVELS
adapter = sys.argv[1]
table, probes = paths(), probe_paths()
counts = [opcodes(*probes[f"{adapter}.replay.{level}"]) for level in LEVELS]
counts.append(opcodes(*table[f"{adapter}.replay"]))
print(json.dumps(counts))
"""


@pytest.mark.parametrize("adapter", ["wsgi", "asgi"])
def test_each_probe_level_runs_less_than_the_middleware_and_more_than_the_bound(
    adapter: str,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _LEVELS, adapter],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    short, store, exchange, middleware = json.loads(done.stdout.splitlines()[-1])
    totals = [sum(c.values()) for c in (short, store, exchange, middleware)]
    assert totals == sorted(set(totals)), totals
    assert "begin (_begin.py)" in middleware
    assert not any("begin (_begin.py)" in c for c in (short, store, exchange))
    assert "Exchange.decide (_exchange.py)" in exchange
    assert "Exchange.decide (_exchange.py)" not in store
    claim = "RedisStore.claim" if adapter == "wsgi" else "AsyncRedisStore.claim"
    assert any(name.startswith(claim) for name in store)
    assert not any(name.startswith(claim) for name in short)


#: idemkey's bytecodes per request over the app alone (``python -m benchmarks.opcodes PATH``),
#: counted on CPython 3.11 with the lock's packages, on stop 48's code. Issue 39's rows in a
#: form no box changes: a change that makes a request do more fails here. Lower a budget with
#: the cut that earns it; raise one only with the reason in the commit message. Stop 52: +1
#: per Content-Length read (the ``try`` around its ``int()``, for a length of thousands of
#: digits), +1 (replay) and +2 (first call) for the ``try`` in ``store.claim`` that gives back
#: a claim whose record cannot be read, +85 (replay) for the check that a stored head can be
#: sent as it is (``_codec._sendable``: a forged record must not split a replay). Stop 53: +8
#: per claim for the test that no line break in a path or scope moves the origin's lines.
#: Audit 53-B: first calls +87 for that same check as the answer is stored (a line a replay
#: would refuse is left out of the record, not stored to be refused for its whole retention);
#: WSGI +36 and ASGI +56 for a body copy that keeps no byte past the declared Content-Length
#: (read in ``BodyCopy.start``; ASGI reads it a second time, 25, until ``TeeSend`` takes
#: ``BodyCopy.declared``) and no block that is not bytes.
#: ASGI first calls +2: the ``try`` around the head's send (a server that raises on it: the
#: record completes, not released for a rerun); then -17: ``TeeSend`` takes the length the body
#: copy read (``BodyCopy.declared``), less a test for a 1xx head and one for trailers.
#: Stop 54: Flask first calls +14 for the test that the body's length is the one declared
#: (one ``in`` of the pair ``set_data`` writes; werkzeug's ``content_length`` cost 136).
#: Audit N-A: every path +43 (one ``_sendable`` per replay, and per first call as the answer is
#: stored) for the head no server sends: a hop-by-hop name (15: a frozenset's ``isdisjoint``
#: over the lowered names), a value with leading or trailing SP/HTAB (18: the values joined
#: again after ``str.strip``, compared), a VT or FF (8: two ``in``), and 2 for naming the
#: joined values, which both use.
#: Then every path -19: the control characters gunicorn refuses (all but HTAB) are refused too,
#: by one latin-1 encoding translated so that each is a NUL and one search for NUL, in place of
#: five ``in`` and the latin-1 test; WSGI and Flask +5 for the ``isascii`` test of the path
#: (PEP 3333's latin-1 text of a non-ASCII path is decoded as UTF-8, as ASGI servers give it).
#: Then first calls +2: the exchange hands the request's fingerprint to its Call, which fenced
#: rows keep whatever thread commits them.
#: Then every path +1: the ``try`` around the driver's ``exchange.decide`` (its NOP), so that a
#: claim whose on_event hook is interrupted is abandoned, not left renewed for good.
#: Then first calls +1: the ``try`` in ``decode_claim_reply`` (its NOP; none on a replay), so a
#: fence or lease time that is no number is a StoreError (a 503), not a ValueError (a 500).
#: Then Flask replays +12 and first calls +66: the answer is settled once the response left
#: Flask (after the after_request hooks), not in the view: BodyCapture's slot for it on every
#: keyed request (12), and on a first call the answer left there (``Pending``, built in C) and
#: completed from BodyCapture (the ``complete`` frame, 28; a test for a second answer, 2).
#: Then Flask first calls +6: the outermost guarded view reserves the slot before it runs (a
#: None appended, set to its answer after), so a guarded view it calls settles in that view.
#: Then first calls +5: a claim's fence is taken only if ``type(fence := reply[1]) is int``
#: (11, less int()'s 6, and the ``try``'s NOP, now past the fresh claim), so a RESP3 double
#: (int() truncated ``,1.5`` to fence 1), null, map or boolean is a StoreError.
#: Then Flask first calls +4: BodyCapture's test for streams of guarded views called from
#: inside another (``NESTED_KEY in environ``), so one the outer view discards is released
#: when the request ends.
#: Then first calls +3 (WSGI, ASGI) and +2 (Flask): a body short of its declared length is
#: stored without it (the tee's test of what remains at the body's end; Flask's streamed flag
#: kept apart from the body, which ``as_sent`` may now drop).
BUDGETS = {
    "wsgi.replay": 1388,
    "asgi.replay": 1457,
    "flask.replay": 997,
    "wsgi.first": 2444,
    "asgi.first": 2510,
    "flask.first": 2374,
}
# In a fresh interpreter: the suite's other tests leave process-wide state behind (a cache of
# header names filled by the fuzz tests' policies would add bytecodes to every lookup).
_COUNT = """
import json, sys
from benchmarks.calls import paths
from benchmarks.opcodes import added_over_app
table = paths()
print(json.dumps({p: added_over_app(table, p) for p in sys.argv[1:]}))
"""


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="budgets counted on CPython 3.11")
def test_no_request_runs_more_of_idemkey_than_its_budget() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _COUNT, *BUDGETS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counted = json.loads(done.stdout.splitlines()[-1])
    over = {path: n for path, n in counted.items() if n > BUDGETS[path]}
    assert not over, f"over budget (bytecodes over the app): {over}, budgets {BUDGETS}"
    assert counted == BUDGETS, f"under budget: lower BUDGETS to {counted}"
