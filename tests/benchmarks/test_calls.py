"""``python -m benchmarks.calls`` counts every path's Python calls against its in-process fake
client (no Redis): it must run, and a replay must replay (its fake answers by the arguments'
positions, so a change in the scripts' arguments shows here first)."""

from __future__ import annotations

import pytest

from benchmarks.calls import main


def test_every_path_runs_and_a_guard_replay_is_counted(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-n", "5"]) == 0
    table = capsys.readouterr().out
    for path in ("guard.first", "guard.replay", "aguard.replay", "wsgi.replay", "asgi.replay"):
        assert f"\n{path} " in table, table
