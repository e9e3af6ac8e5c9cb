"""Latency budgets: parsing ``--budget`` strings and checking them (pure: no Redis, fast)."""

from __future__ import annotations

import pytest

from benchmarks import main
from benchmarks.budget import Budget, BudgetError, check_budgets, parse_budgets

# A results document as the suite writes it: statistics in nanoseconds.
CASES = {
    "redis.ping": {"p50": 50_000, "p90": 70_000, "p99": 120_000, "mean": 55_000},
    "floor.first": {"p50": 120_000, "p90": 150_000, "p99": 300_000, "mean": 130_000},
    "floor.replay": {"p50": 60_000, "p90": 80_000, "p99": 150_000, "mean": 65_000},
    "guard.first": {"p50": 132_000, "p90": 170_000, "p99": 400_000, "mean": 140_000,
                    "floor": "floor.first"},
    "guard.replay": {"p50": 72_000, "p90": 90_000, "p99": 1_900_000, "mean": 80_000,
                     "floor": "floor.replay"},
    "cpu.guard.first": {"p50": 9_500, "p90": 12_000, "p99": 30_000, "mean": 10_000},
}  # fmt: skip


def test_ratio_budget_on_an_alias() -> None:
    (budget,) = parse_budgets("miss<=1.15xfloor")
    assert budget == Budget("miss<=1.15xfloor", "guard.first", "p50", 1.15, "floor", None)


def test_a_list_of_budgets_with_spaces() -> None:
    budgets = parse_budgets(" miss <= 1.15x floor , replay<=1.2xping ")
    assert [(b.case, b.ratio, b.reference) for b in budgets] == [
        ("guard.first", 1.15, "floor"),
        ("guard.replay", 1.2, "ping"),
    ]


@pytest.mark.parametrize(
    ("text", "nanoseconds"),
    [
        ("replay:p99<=2ms", 2_000_000),
        ("replay:p99<=800us", 800_000),
        ("replay:p99<=800µs", 800_000),
        ("replay:p99<=0.5s", 500_000_000),
        ("replay:p99<=900ns", 900),
        ("replay:p99<=.25ms", 250_000),
    ],
)
def test_absolute_budget_units(text: str, nanoseconds: float) -> None:
    (budget,) = parse_budgets(text)
    assert (budget.case, budget.stat, budget.ratio) == ("guard.replay", "p99", None)
    assert budget.limit_ns == pytest.approx(nanoseconds)


def test_a_bare_statistic_applies_to_first_call_and_replay() -> None:
    budgets = parse_budgets("p99<=3ms")
    assert [(b.case, b.stat, b.limit_ns) for b in budgets] == [
        ("guard.first", "p99", 3e6),
        ("guard.replay", "p99", 3e6),
    ]


def test_case_names_and_aliases_as_reference() -> None:
    (budget,) = parse_budgets("aguard.first:p90<=1.3xmiss")
    assert (budget.case, budget.stat, budget.reference) == ("aguard.first", "p90", "guard.first")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "no budget given"),
        ("miss", "expected [CASE][:STAT]<=LIMIT"),
        ("miss<1.15xfloor", "only '<=' budgets exist"),
        ("miss>=1.15xfloor", "only '<=' budgets exist"),
        ("miss<=", "the limit after '<=' is missing"),
        ("miss<=1.15", "use a ratio like '1.15xfloor'"),
        ("miss<=fast", "invalid limit 'fast'"),
        ("miss<=2 hours", "invalid limit '2 hours'"),
        ("miss<=0xfloor", "greater than zero"),
        ("miss<=0ms", "greater than zero"),
        ("miss<=-1ms", "invalid limit '-1ms'"),
        ("miss:p42<=1ms", "invalid statistic 'p42'"),
        ("miss:<=1ms", "the statistic after ':' is missing"),
        (":p99<=1ms", "the case before ':' is missing"),
        ("<=1ms", "the case or statistic is missing"),
        ("my case<=1ms", "invalid case name 'my case'"),
        ("miss<=1xfloor,,replay<=1xfloor", "remove the extra comma"),
    ],
)
def test_invalid_budgets_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(BudgetError) as info:
        parse_budgets(text)
    assert says in str(info.value)


def test_ratio_to_the_floor_holds_and_fails() -> None:
    held, exceeded = check_budgets(parse_budgets("miss<=1.15xfloor,replay<=1.15xfloor"), CASES)
    assert held.ok  # 132 / 120 = 1.10
    assert "1.100x floor.first <= 1.15x" in held.detail
    assert not exceeded.ok  # 72 / 60 = 1.20
    assert "1.200x floor.replay > 1.15x" in exceeded.detail


def test_ratio_uses_the_same_statistic_of_the_reference() -> None:
    # p99: 400 / 300 = 1.33, although the p50 ratio is 1.10
    (verdict,) = check_budgets(parse_budgets("miss:p99<=1.3xfloor"), CASES)
    assert not verdict.ok


def test_absolute_budgets() -> None:
    verdicts = check_budgets(parse_budgets("p99<=2ms,cpu.miss<=15us"), CASES)
    assert [v.ok for v in verdicts] == [True, True, True]
    (tight,) = check_budgets(parse_budgets("replay:p99<=1ms"), CASES)
    assert not tight.ok
    assert "1.900 ms > 1.000 ms" in tight.detail


def test_a_budget_on_a_case_that_was_not_measured_fails_with_the_reason() -> None:
    budgets = parse_budgets("peer.idemkit.first<=2xping,wsgi.first<=1ms")
    skipped = {"peer.idemkit.first": "idemkit is not installed"}
    missing, unknown = check_budgets(budgets, CASES, skipped)
    assert not missing.ok
    assert "skipped: idemkit is not installed" in missing.detail
    assert not unknown.ok
    assert "no such case in this run" in unknown.detail


def test_floor_ratio_on_a_case_without_a_floor_fails() -> None:
    (verdict,) = check_budgets(parse_budgets("redis.ping<=2xfloor"), CASES)
    assert not verdict.ok
    assert "has no bare floor" in verdict.detail


def test_the_cli_rejects_a_bad_budget_before_touching_redis(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # No Redis URL and no redis-server needed: the budget is checked first.
    assert main(["--budget", "miss<=fast", "--redis-url", "redis://127.0.0.1:1/0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid limit 'fast'")
    assert "Traceback" not in err


def test_the_cli_reports_usage_errors_as_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--rounds", "many"]) == 2
    assert "invalid int value" in capsys.readouterr().err


MEMORY_GOAL = (
    "a completed 100 B result <= 184 B over a plain string (the goal 400 B at a 216 B string)"
)


GLIDE_GOAL = "throughput on glide (64 clients, uvicorn) >= 1.3x app + bare redis-py floor"


def test_scale_targets_read_time_over_the_floor_memory_server_time_and_throughput() -> None:
    from benchmarks.report import check_scale_targets

    doc = {
        "cases": CASES,
        "memory": [
            {
                "size": 100,
                "guard_record_bytes": 400,
                "guard_floor_bytes": 216,
                "http_record_bytes": 448,
                "http_floor_bytes": 264,
            }
        ],
        "server_time": {"first_x_floor": 1.10, "replay_x_floor": 1.2},
        "throughput": {"ratio_to_floor": 0.97, "glide_ratio_to_floor": 1.25},
    }
    verdicts = {t["target"]: (t["ok"], t["measured"]) for t in check_scale_targets(doc)}
    assert verdicts == {
        "guard.first <= 25 us over the floor": (True, "+12.0 us"),
        "guard.replay <= 10 us over the floor": (False, "+12.0 us"),
        MEMORY_GOAL: (True, "+184 B (400 B; HTTP record +184 B)"),
        "Redis server time per first <= 1.3x floor scripts": (True, "1.10x"),
        "Redis server time per replay <= 1.1x floor scripts": (False, "1.20x"),
        "throughput (64 clients, uvicorn) >= 1x app + floor": (False, "0.97x"),
        GLIDE_GOAL: (False, "1.25x"),
    }
