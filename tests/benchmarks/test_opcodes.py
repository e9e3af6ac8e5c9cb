"""``python -m benchmarks.opcodes`` profiles one request of a path by the bytecodes each
function runs: the same count every time (it is the note's profile of each HTTP row), and
what idemkey runs, not the app alone."""

from __future__ import annotations

import pytest

from benchmarks.calls import paths
from benchmarks.opcodes import main, opcodes, probe_paths
from benchmarks.short_probe import LEVELS


def test_a_replay_is_profiled_the_same_every_time() -> None:
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


@pytest.mark.parametrize("adapter", ["wsgi", "asgi"])
def test_each_probe_level_runs_less_than_the_middleware_and_more_than_the_bound(
    adapter: str,
) -> None:
    table, probes = paths(), probe_paths()
    middleware = opcodes(*table[f"{adapter}.replay"])
    short, store, exchange = (opcodes(*probes[f"{adapter}.replay.{level}"]) for level in LEVELS)
    totals = [sum(c.values()) for c in (short, store, exchange, middleware)]
    assert totals == sorted(set(totals)), totals
    assert "begin (_begin.py)" in middleware
    assert not any("begin (_begin.py)" in c for c in (short, store, exchange))
    assert "Exchange.decide (_exchange.py)" in exchange
    assert "Exchange.decide (_exchange.py)" not in store
    claim = "RedisStore.claim" if adapter == "wsgi" else "AsyncRedisStore.claim"
    assert any(name.startswith(claim) for name in store)
    assert not any(name.startswith(claim) for name in short)
