"""Latency budgets: parse ``--budget`` strings and check them against measured results.

Pure functions, no I/O, so tests cover them without Redis. A budget list is comma-separated;
each budget is ``[CASE][:STAT]<=LIMIT`` where

* ``CASE`` is a case name from the results table (``guard.replay``) or an alias: ``miss``
  and ``first`` (``guard.first``), ``replay`` (``guard.replay``), ``amiss``/``afirst`` and
  ``areplay`` (the ``aguard`` twins), ``cpu.miss``/``cpu.replay`` (own CPU with a fake
  client). Without a case, the budget holds each of ``miss`` and ``replay``.
* ``STAT`` is ``p50`` (the default), ``p90``, ``p99`` or ``mean``.
* ``LIMIT`` is a ratio ``1.15xfloor``, ``2.5xping`` or ``1.2x<case>`` (the same statistic of
  the reference; ``floor`` is the bare-EVALSHA floor of the case itself), or an absolute time
  ``2ms``, ``800us``, ``15µs``, ``0.5s``, ``900ns``.

Examples: ``miss<=1.15xfloor,replay<=1.15xfloor``, ``replay:p99<=2ms``, ``p99<=3ms``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "ALIASES",
    "STATS",
    "Budget",
    "BudgetError",
    "Verdict",
    "check_budgets",
    "parse_budgets",
    "resolve_case",
]

STATS: Final = ("p50", "p90", "p99", "mean")

ALIASES: Final[Mapping[str, str]] = {
    "miss": "guard.first",
    "first": "guard.first",
    "replay": "guard.replay",
    "amiss": "aguard.first",
    "afirst": "aguard.first",
    "areplay": "aguard.replay",
    "cpu.miss": "cpu.guard.first",
    "cpu.first": "cpu.guard.first",
    "cpu.replay": "cpu.guard.replay",
}
_DEFAULT_CASES: Final = ("guard.first", "guard.replay")

_UNITS: Final[Mapping[str, float]] = {
    "ns": 1.0,
    "us": 1e3,
    "µs": 1e3,
    "μs": 1e3,  # GREEK SMALL LETTER MU, which some keyboards give for the micro sign
    "ms": 1e6,
    "s": 1e9,
}
_NUMBER: Final = r"(?:\d+(?:\.\d*)?|\.\d+)"
_CASE_NAME: Final = re.compile(r"[A-Za-z0-9_.\-]+")
# A ratio is written with x or U+00D7 MULTIPLICATION SIGN.
_RATIO: Final = re.compile(rf"({_NUMBER})\s*[x\u00d7]\s*([A-Za-z0-9_.\-]+)")
_ABSOLUTE: Final = re.compile(rf"({_NUMBER})\s*(ns|us|µs|μs|ms|s)")


class BudgetError(ValueError):
    """A budget string that cannot be parsed; the message says what is wrong and shows the form."""


@dataclass(frozen=True, slots=True)
class Budget:
    """One limit: ``case``'s ``stat`` must be <= ``limit_ns``, or <= ``ratio`` x ``reference``."""

    text: str
    case: str
    stat: str = "p50"
    ratio: float | None = None
    reference: str | None = None  # a case name, or "floor" for the case's own floor
    limit_ns: float | None = None

    def describe(self) -> str:
        limit = (
            f"{self.ratio:g}x {self.reference}"
            if self.ratio is not None
            else _format_ns(self.limit_ns or 0.0)
        )
        return f"{self.case} {self.stat} <= {limit}"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of checking one budget."""

    budget: Budget
    ok: bool
    detail: str


_FORM: Final = "expected [CASE][:STAT]<=LIMIT, e.g. 'miss<=1.15xfloor' or 'replay:p99<=2ms'"


def resolve_case(name: str) -> str:
    """The case name an alias stands for (names that are not aliases are returned as they are)."""
    return ALIASES.get(name, name)


def parse_budgets(text: str) -> list[Budget]:
    """Parse a comma-separated budget list; raises :class:`BudgetError` with a clear reason."""
    budgets: list[Budget] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            if text.strip():
                raise BudgetError(f"empty budget in {text!r}: remove the extra comma")
            raise BudgetError(f"no budget given; {_FORM}")
        budgets.extend(_parse_one(item))
    return budgets


def _parse_one(item: str) -> list[Budget]:
    if "<=" not in item:
        hint = " (only '<=' budgets exist)" if any(op in item for op in ("<", ">", "=")) else ""
        raise BudgetError(f"invalid budget {item!r}: {_FORM}{hint}")
    left, _, right = item.partition("<=")
    left, right = left.strip(), right.strip()
    case, stat = _parse_subject(item, left)
    if not right:
        raise BudgetError(f"invalid budget {item!r}: the limit after '<=' is missing; {_FORM}")
    ratio: float | None = None
    reference: str | None = None
    limit_ns: float | None = None
    if match := _RATIO.fullmatch(right):
        ratio = float(match.group(1))
        reference = match.group(2)
        reference = reference if reference in ("floor", "ping") else resolve_case(reference)
    elif match := _ABSOLUTE.fullmatch(right):
        limit_ns = float(match.group(1)) * _UNITS[match.group(2)]
    else:
        raise BudgetError(
            f"invalid limit {right!r} in {item!r}: use a ratio like '1.15xfloor' or '2xping',"
            " or a time like '2ms', '800us', '0.5s'"
        )
    value = ratio if ratio is not None else limit_ns
    if value is None or not math.isfinite(value) or value <= 0:
        raise BudgetError(f"invalid limit {right!r} in {item!r}: it must be greater than zero")
    cases = _DEFAULT_CASES if case is None else (case,)
    return [Budget(item, c, stat, ratio, reference, limit_ns) for c in cases]


def _parse_subject(item: str, left: str) -> tuple[str | None, str]:
    """Split ``CASE:STAT``, ``CASE`` or ``STAT`` into (case or None, stat)."""
    case_part, sep, stat_part = left.partition(":")
    case_part, stat_part = case_part.strip(), stat_part.strip()
    if not sep:
        if left in STATS:
            return None, left
        case_part, stat_part = left, "p50"
    if sep and not stat_part:
        raise BudgetError(f"invalid budget {item!r}: the statistic after ':' is missing")
    if stat_part not in STATS:
        raise BudgetError(
            f"invalid statistic {stat_part!r} in {item!r}: use one of {', '.join(STATS)}"
        )
    if not case_part:
        if sep:
            raise BudgetError(f"invalid budget {item!r}: the case before ':' is missing")
        raise BudgetError(f"invalid budget {item!r}: the case or statistic is missing; {_FORM}")
    if _CASE_NAME.fullmatch(case_part) is None:
        raise BudgetError(
            f"invalid case name {case_part!r} in {item!r}: letters, digits, '.', '_' and '-' only"
        )
    return resolve_case(case_part), stat_part


def check_budgets(
    budgets: Iterable[Budget],
    cases: Mapping[str, Mapping[str, object]],
    skipped: Mapping[str, str] | None = None,
) -> list[Verdict]:
    """Check each budget against ``cases`` (name -> JSON case: ``p50``... in ns, ``floor``).

    A budget on a case that was not measured fails, with the skip reason when there is one:
    a CI budget must never pass because its case silently vanished.
    """
    skipped = skipped or {}
    verdicts: list[Verdict] = []
    for budget in budgets:
        verdicts.append(_check(budget, cases, skipped))
    return verdicts


def _check(
    budget: Budget, cases: Mapping[str, Mapping[str, object]], skipped: Mapping[str, str]
) -> Verdict:
    def missing(name: str) -> Verdict:
        why = f"skipped: {skipped[name]}" if name in skipped else "no such case in this run"
        return Verdict(budget, False, f"{name} was not measured ({why})")

    case = cases.get(budget.case)
    if case is None:
        return missing(budget.case)
    value = _stat(case, budget.stat)
    if budget.limit_ns is not None:
        ok = value <= budget.limit_ns
        return Verdict(
            budget, ok, f"{_format_ns(value)} {'<=' if ok else '>'} {_format_ns(budget.limit_ns)}"
        )
    assert budget.ratio is not None
    assert budget.reference is not None
    ref_name = budget.reference
    if ref_name == "floor":
        floor = case.get("floor")
        if not isinstance(floor, str):
            return Verdict(budget, False, f"{budget.case} has no bare floor to compare with")
        ref_name = floor
    reference = cases.get(ref_name)
    if reference is None:
        return missing(ref_name)
    ref_value = _stat(reference, budget.stat)
    if ref_value <= 0:
        return Verdict(budget, False, f"{ref_name} {budget.stat} is zero; no ratio")
    ratio = value / ref_value
    ok = ratio <= budget.ratio
    return Verdict(
        budget,
        ok,
        f"{ratio:.3f}x {ref_name} {'<=' if ok else '>'} {budget.ratio:g}x "
        f"({_format_ns(value)} vs {_format_ns(ref_value)})",
    )


def _stat(case: Mapping[str, object], stat: str) -> float:
    value = case.get(stat)
    if not isinstance(value, int | float):
        raise BudgetError(f"case has no {stat} value")
    return float(value)


def _format_ns(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} us"
    return f"{ns:.0f} ns"
