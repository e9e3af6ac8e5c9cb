"""The sans-IO doctor checks: a verdict from INFO/CONFIG values, no server needed."""

from __future__ import annotations

import pytest

from idemkey.store import diagnostics as dx


@pytest.mark.parametrize(
    "policy", ["volatile-lru", "volatile-ttl", "allkeys-lru", "allkeys-random", b"volatile-lfu"]
)
def test_every_policy_but_noeviction_warns(policy: str | bytes) -> None:
    warning = dx.eviction_warning(policy)
    assert warning is not None
    assert "noeviction" in warning
    assert dx.check_eviction({"maxmemory_policy": policy, "maxmemory": 0}).verdict == "WARN"


def test_volatile_policies_are_called_out_because_records_carry_a_ttl() -> None:
    warning = dx.eviction_warning("volatile-lru", 1 << 30)
    assert warning is not None
    assert "volatile-*" in warning
    assert "1.0 GiB" in warning


def test_noeviction_is_fine_in_both_spellings() -> None:
    assert dx.eviction_warning("noeviction") is None
    assert dx.eviction_warning(b"NoEviction ") is None
    check = dx.check_eviction({"maxmemory-policy": "noeviction", "maxmemory": "104857600"})
    assert (check.verdict, check.detail) == ("OK", "noeviction (maxmemory 100.0 MiB)")


@pytest.mark.parametrize("maxmemory", ["4gb", "1e9", "\u00b2", b"-1"])
def test_a_maxmemory_that_is_no_number_of_bytes_is_shown_as_given(maxmemory: str | bytes) -> None:
    """A Check, never a ValueError: a proxy or an older server may spell the limit otherwise
    (and ``str.isdigit`` passes a superscript two, which ``int()`` refuses)."""
    shown = maxmemory.decode() if isinstance(maxmemory, bytes) else maxmemory
    check = dx.check_eviction({"maxmemory-policy": "noeviction", "maxmemory": maxmemory})
    assert (check.verdict, check.detail) == ("OK", f"noeviction (maxmemory {shown})")
    warning = dx.eviction_warning("allkeys-lru", maxmemory)
    assert warning is not None
    assert f"when memory reaches maxmemory ({shown})" in warning


def test_unknown_eviction_policy_is_a_warning() -> None:
    assert dx.check_eviction({}).verdict == "WARN"


@pytest.mark.parametrize(
    ("save", "appendonly", "verdict"),
    [
        ("", "no", "WARN"),
        (b"", b"no", "WARN"),
        ("3600 1 300 100", "no", "OK"),
        ("", "yes", "OK"),
        ("900 1", "yes", "OK"),
        (None, None, "WARN"),
    ],
)
def test_persistence(save: str | None, appendonly: str | None, verdict: str) -> None:
    assert dx.check_persistence(save, appendonly).verdict == verdict


@pytest.mark.parametrize(
    ("version", "verdict"),
    [("7.0.15", "OK"), ("7.2.4", "OK"), ("6.2.14", "WARN"), ("5.0.7", "WARN"), ("4.0.14", "FAIL"),
     ("", "WARN"), ("unstable", "WARN")],
)  # fmt: skip
def test_version(version: str, verdict: str) -> None:
    assert dx.check_version({"redis_version": version}).verdict == verdict


def test_valkey_reports_its_own_version() -> None:
    check = dx.check_version({"redis_version": "7.2.4", "valkey_version": "8.0.1"})
    assert (check.verdict, check.detail) == ("OK", "valkey 8.0.1")


def test_mode_and_role() -> None:
    assert dx.mode({"redis_mode": "standalone"}) == "standalone"
    assert dx.mode({"redis_mode": "cluster"}) == "cluster"
    assert dx.mode({"cluster_enabled": 1}) == "cluster"
    assert dx.check_mode({"redis_mode": "sentinel"}).verdict == "FAIL"
    assert dx.check_role({"role": "slave"}).verdict == "FAIL"
    assert dx.check_role({"role": "master"}).verdict == "OK"


def test_scripts_and_round_trip() -> None:
    assert dx.check_scripts({"claim": "ab12", "complete": "cd34"}).verdict == "OK"
    assert dx.check_scripts({"claim": "ab12", "complete": None}).verdict == "FAIL"
    assert dx.check_round_trip([0.0001, 0.0002, 0.0003]).verdict == "OK"
    assert dx.check_round_trip([0.02, 0.03, 0.0001]).verdict == "WARN"
    assert dx.check_round_trip([]).verdict == "FAIL"


def test_worst() -> None:
    ok, warn, fail = (dx.Check("x", v, "") for v in ("OK", "WARN", "FAIL"))  # type: ignore[arg-type]
    assert dx.worst([]) == "OK"
    assert dx.worst([ok, warn]) == "WARN"
    assert dx.worst([warn, fail, ok]) == "FAIL"
