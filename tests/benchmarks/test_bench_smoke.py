"""The quick benchmark suite against the session's real Redis, with loose budgets.

Not a timing test of the machine: the budgets are ratios inside one interleaved run (both
sides share the noise) at 1.5x the design targets (docs/design.md#performance-targets: a
first call <= 1.0x the bare floor, a replay <= 0.95x). What it does hold exactly: a replay is
one round trip and one EVALSHA, a first call two, and every core case is in the JSON.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks import main

# Out of the default run (pyproject's addopts): `pytest -m benchmark -n 0`, a step of its own in CI.
pytestmark = [pytest.mark.benchmark, pytest.mark.redis]

CORE_CASES = {
    "redis.ping", "floor.first", "floor.replay", "guard.first", "guard.replay",
    "aredis.ping", "afloor.first", "afloor.replay", "aguard.first", "aguard.replay",
    "cpu.guard.first", "cpu.guard.replay", "cpu.aguard.first", "cpu.aguard.replay",
    "floor.steps3", "guard.steps3",
}  # fmt: skip
LOOSE = "miss<=1.5xfloor,replay<=1.425xfloor,amiss<=1.5xfloor,areplay<=1.425xfloor"


def test_quick_suite_holds_loose_budgets(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    status = main(["--quick", "--redis-url", redis_url, "--json", str(out), "--budget", LOOSE])
    printed = capsys.readouterr().out
    assert status == 0, printed
    doc = json.loads(out.read_text())
    assert set(doc["cases"]) >= CORE_CASES
    for name in CORE_CASES:
        case = doc["cases"][name]
        assert case["n"] == 300
        assert 0 < case["p50"] <= case["p90"] <= case["p99"]
    cases = doc["cases"]
    # One round trip per replay, two per first call, sync and async alike.
    assert cases["guard.replay"]["round_trips"] == 1
    assert cases["aguard.replay"]["round_trips"] == 1
    assert cases["guard.first"]["round_trips"] == 2
    assert cases["aguard.first"]["round_trips"] == 2
    # A recovery point costs one round trip: a 3-step first call makes five.
    assert cases["guard.steps3"]["round_trips"] == 5
    if not os.environ.get("IDEMKEY_REDIS_URL"):  # the session's private server: exact stats
        assert cases["guard.replay"]["evalsha"] == 1
        assert cases["guard.first"]["evalsha"] == 2
        assert cases["guard.steps3"]["evalsha"] == 5
    assert [b["ok"] for b in doc["budgets"]] == [True] * 4
    assert set(doc["cpu_warm"]) == {"guard.first", "guard.replay", "aguard.first",
                                    "aguard.replay"}  # fmt: skip
    assert "| guard.replay |" in printed


def test_an_exceeded_budget_fails_the_run(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # No guarded call can beat a bare PING: the budget must fail, and the run exit 1.
    status = main(["--quick", "--rounds", "50", "--redis-url", redis_url,
                   "--budget", "replay<=0.5xping"])  # fmt: skip
    assert status == 1
    assert "FAIL replay<=0.5xping" in capsys.readouterr().out


def test_the_glide_benchmark_measures_both_clients_and_the_throughput_rows(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("glide", reason="valkey-glide is not installed (idemkey[glide])")
    from benchmarks.glide_bench import main as glide_main

    out = tmp_path / "glide.json"
    argv = ["--redis-url", redis_url, "--rounds", "50", "--slices", "1",
            "--throughput-seconds", "0.5", "--json", str(out)]  # fmt: skip
    assert glide_main(argv) in (0, 1)  # 1: the goal missed on this box, not a failure here
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    for name in ("aguard.first", "gaguard.first", "gfloor.first", "gaguard.replay"):
        assert doc["cases"][name]["n"] == 50
    assert {name: len(rates) for name, rates in doc["inprocess"].items()} == {
        "redis.asyncio": 3,
        "glide": 3,
    }
    tp = doc["throughput"]
    assert tp["glide_rps"] > 0
    assert tp["glide_floor_rps"] > 0
    assert tp["glide_ratio_to_floor"] == pytest.approx(tp["glide_rps"] / tp["floor_rps"])
    assert "| aguard(), first call |" in printed
    assert "throughput on glide (64 clients, uvicorn) >= 1.3x" in printed
    assert "In one process, 64 asyncio tasks calling aguard" in printed


def test_effects_adds_the_fenced_sql_cases_with_effects_on_and_off(
    redis_url: str, tmp_path: Path
) -> None:
    pytest.importorskip("sqlalchemy", reason="the sql extra (SQLAlchemy) is not installed")
    out = tmp_path / "bench.json"
    status = main(
        ["--quick", "--effects", "--rounds", "30", "--redis-url", redis_url, "--json", str(out)]
    )
    assert status in (0, 1)  # the timing targets are not this test's business
    cases = json.loads(out.read_text())["cases"]
    for name in ("first", "after", "replay"):
        for side in ("off", "on"):
            assert cases[f"effects.{side}.{name}"]["n"] == 30


def test_a_throughput_slice_in_which_the_floor_answered_nothing_is_printed_not_a_crash() -> None:
    """On a loaded box a short slice may see no floor request finish: its ratio is None."""
    from benchmarks.glide_bench import format_glide

    tp = {"clients": 64, "server": "uvicorn", "slices": 1, "slice_seconds": 0.2,
          "plain_rps": 10.0, "floor_rps": 0.0, "idemkey_rps": 5.0, "glide_floor_rps": 3.0,
          "glide_rps": 2.0, "glide_ratio_to_floor": None}  # fmt: skip
    lines = format_glide({}, tp)
    assert "| 10 | 0 | 5 | 3 | 2 | n/ax |" in lines
