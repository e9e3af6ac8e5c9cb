"""Policy options are typed, checked and frozen once (``idemkey._options``), with no I/O.

Issue 20 item 10: ``Policy(methods="POST")`` became ``{'P', 'O', 'S', 'T'}`` and guarded
nothing. Every bad option is now a ConfigurationError naming it; the adapter paths (Flask config
and views, Django, FastAPI, Starlette) are in ``tests/adapters/test_options.py``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import pytest

from idemkey import ConfigurationError, Policy
from idemkey.policy import Replicas
from idemkey.routes import Routes, route

#: (options, what the error says after the option's label). One per kind of mistake.
BAD: list[tuple[dict[str, Any], str]] = [
    ({"methods": "POST"}, "expected a collection of method names, got the string 'POST'"),
    ({"release_statuses": "409"}, "expected a collection of HTTP status codes, got the string"),
    ({"header_denylist": "set-cookie"}, "expected a collection of header names, got the string"),
    ({"header_allowlist": "etag"}, "expected a collection of header names, got the string"),
    ({"methods": ["POST", 1]}, "expected a collection of method names, one of them is 1 (int)"),
    ({"lease": "30"}, "expected a number of seconds > 0, got the string '30'"),
    ({"wait": True}, "expected a number of seconds >= 0, got True (bool)"),
    ({"ttl": -1}, "expected a finite number of seconds > 0, got -1 (int)"),
    ({"wait": -0.5}, "expected a finite number of seconds >= 0, got -0.5"),
    ({"wait": math.nan}, "expected a finite number of seconds >= 0, got nan"),
    ({"ttl": math.inf}, "expected a finite number of seconds > 0, got inf"),
    ({"store_error_retry_after": -1}, "expected a finite number of seconds >= 0"),
    ({"require_key": "false"}, "expected True or False, got the string 'false'"),
    ({"max_request_bytes": 1.5}, "expected a size in bytes (an int >= 0), got 1.5"),
    ({"mismatch_status": "422"}, "expected 400 or 409 or 422, got the string '422'"),
    ({"tll": 60}, "not a Policy field; did you mean Policy(ttl=...)?"),
]


def _ids(case: tuple[dict[str, Any], str]) -> str:
    ((name, value),) = case[0].items()
    return f"{name}={value!r}"


@pytest.mark.parametrize("case", BAD, ids=[_ids(c) for c in BAD])
def test_policy_refuses_a_bad_option_naming_it(case: tuple[dict[str, Any], str]) -> None:
    options, says = case
    ((name, _),) = options.items()
    expected = re.escape(f"Policy({name}=...): {says}")
    with pytest.raises(ConfigurationError, match=expected):
        Policy(**options)
    with pytest.raises(ConfigurationError, match=expected):  # replace is the same boundary
        Policy().replace(**options)


def test_policy_methods_as_a_bare_string_is_refused_not_split_into_letters() -> None:
    # Before the converter of issue 20 this was a Policy whose methods were {'P', 'O', 'S', 'T'}:
    # nothing was guarded.
    with pytest.raises(ConfigurationError) as raised:
        Policy(methods="POST")  # type: ignore[arg-type]
    assert str(raised.value) == (
        "Policy(methods=...): expected a collection of method names, got the string 'POST'"
    )


def test_valid_options_are_still_accepted_and_frozen() -> None:
    for methods in (["post"], ("POST", "patch"), {"put"}, frozenset({"Delete"})):
        policy = Policy(methods=methods)  # type: ignore[arg-type]
        assert policy.methods == frozenset(m.upper() for m in methods)
        assert type(policy.methods) is frozenset
    policy = Policy(
        ttl=60,
        lease=5,
        wait=0,
        store_error_retry_after=2,
        release_statuses=[409, 400],  # type: ignore[arg-type]
        header_denylist=["X-Secret"],  # type: ignore[arg-type]
        header_allowlist=("ETag",),  # type: ignore[arg-type]
        max_request_bytes=10,
        require_key=False,
    )
    assert (policy.ttl, policy.lease, policy.wait, policy.store_error_retry_after) == (60, 5, 0, 2)
    assert all(type(v) is float for v in (policy.ttl, policy.lease, policy.wait))
    assert (policy.ttl_ms, policy.lease_ms) == (60_000, 5_000)
    assert policy.release_statuses == frozenset({400, 409})
    assert policy.header_denylist == frozenset({"x-secret"})
    assert policy.header_allowlist == frozenset({"etag"})
    assert Policy(max_response_bytes=1e6).max_response_bytes == 1_000_000  # a whole number
    # Converting a converted policy changes nothing.
    assert policy.replace() == policy
    assert Policy() == Policy().replace(methods=["post", "PATCH"])


def test_every_policy_field_has_a_converter() -> None:
    """A field added to Policy gets its converter too, or no path checks it."""
    from idemkey._options import _CONVERTERS

    fields = {f.name for f in dataclasses.fields(Policy) if f.init}
    assert fields == set(_CONVERTERS)


def test_lease_longer_than_ttl_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="need lease < ttl, got lease=60 ttl=10"):
        Policy(ttl=10, lease=60)


def test_route_options_name_the_route() -> None:
    with pytest.raises(ConfigurationError) as raised:
        route("/charges/{charge_id}", methods="POST")
    assert str(raised.value) == (
        "route('/charges/{charge_id}', methods=...): expected a collection of method names, "
        "got the string 'POST'"
    )
    with pytest.raises(ConfigurationError, match=re.escape("route('/c', wait=...): expected")):
        route("/c", wait=-1)
    with pytest.raises(ConfigurationError, match=re.escape("route('/c', requird=...): not a")):
        route("/c", requird=False)
    # A lease over the base policy's ttl is known at bind time, and names the route.
    with pytest.raises(ConfigurationError, match=re.escape("route('/c'): Policy: need lease")):
        Routes(route("/c", lease=100)).bind(Policy(ttl=50, lease=5))
    table = Routes(route("/c", methods=["post"], required=False)).bind(Policy())
    selected = table.select("POST", "/c")
    assert selected is not None
    assert selected.policy.require_key is False


def test_replicas_timeout_is_a_finite_positive_duration() -> None:
    assert Replicas(1, 1).timeout == 1.0
    for timeout in (0, -1, math.inf, math.nan, "1"):
        with pytest.raises(ConfigurationError, match=r"Replicas\(timeout=\.\.\.\)"):
            Replicas(1, timeout)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"Replicas\.count"):
        Replicas(True)


def test_the_fake_stores_name_themselves_in_option_errors() -> None:
    from idemkey.testing import fake_async_store, fake_store

    with pytest.raises(ConfigurationError) as raised:
        fake_store(methods="POST")
    assert str(raised.value) == (
        "fake_store(methods=...): expected a collection of method names, got the string 'POST'"
    )
    with pytest.raises(ConfigurationError, match=re.escape("did you mean fake_store(wait=...)")):
        fake_store(wiat=1.0)
    with pytest.raises(ConfigurationError, match=re.escape("fake_async_store: Policy: need")):
        fake_async_store(lease=100, ttl=10)
    assert fake_store(wait=1, methods=["post"]).policy.methods == frozenset({"POST"})


# ---- audit 53: bounds on durations, names that no request can carry ------------------------


@pytest.mark.parametrize("lease", [1e-9, 0.001, 0.05, 0.0999])
def test_a_lease_too_short_to_renew_is_refused(lease: float) -> None:
    # On main a 1 ms lease (1e-9 rounded up) was accepted: the heartbeat, renewing every
    # lease/3, could not hold it, and one key's work ran two or three times at once.
    with pytest.raises(
        ConfigurationError, match=re.escape("Policy(lease=...): expected at least 0.1")
    ):
        Policy(lease=lease)
    with pytest.raises(ConfigurationError, match=re.escape("route('/c', lease=...): expected")):
        route("/c", lease=lease)
    assert Policy(lease=0.1).lease_ms == 100


TOO_LONG = [1e14, 2**63, 1e300, 10**400]


@pytest.mark.parametrize("field", ["ttl", "wait", "expired_grace", "store_error_retry_after"])
@pytest.mark.parametrize("value", TOO_LONG, ids=["1e14", "2**63", "1e300", "10**400"])
def test_a_duration_past_ten_years_is_refused(field: str, value: float) -> None:
    # On main ttl=1e14 passed, then claim.lua's PEXPIRE failed after its HSET: an in-progress
    # record that never expires; 10**400 was an untyped OverflowError.
    with pytest.raises(
        ConfigurationError, match=re.escape(f"Policy({field}=...): expected at most")
    ):
        Policy(**{field: value})
    with pytest.raises(ConfigurationError, match="10 years"):
        Policy().replace(**{field: value})


def test_the_longest_durations_stay_whole_milliseconds_that_redis_and_lua_take() -> None:
    from idemkey._options import MAX_SECONDS

    longest = Policy(ttl=MAX_SECONDS, lease=MAX_SECONDS / 2, expired_grace=MAX_SECONDS)
    # Lua prints a number of 1e14 or more as "1e+14", which PEXPIRE and HSET refuse; a claim
    # writes now + lease_ms, a completion ttl_ms + grace_ms.
    now_ms = 4_102_444_800_000  # 2100-01-01
    assert now_ms + longest.lease_ms < 10**14
    assert longest.ttl_ms + longest.grace_ms < 10**14
    with pytest.raises(ConfigurationError, match=re.escape("Policy(lease=...): expected at most")):
        Policy(lease=1e13)


def test_replicas_are_bounded() -> None:
    for count in (2**31, 10**30):
        with pytest.raises(ConfigurationError, match=r"Replicas\.count"):
            Replicas(count)
    for timeout in (1e300, 10**400, 1e14):
        with pytest.raises(
            ConfigurationError, match=r"Replicas\(timeout=\.\.\.\): expected at most"
        ):
            Replicas(1, timeout)
    assert Replicas(2**31 - 1, 60).timeout_ms == 60_000


BAD_NAMES = [
    "Idempotency-Key ",
    "Idempotency-Key:",
    "Idempotency Key",
    "Idem\r\nX: y",
    "(key)",
    "a\n",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_header_name_no_request_can_carry_is_refused(name: str) -> None:
    # On main these passed: with require_key=False every retry ran again, and Flask sent a
    # retention header 'X-Retention\r\nSet-Cookie: ...' as a name.
    for field in ("header", "retention_header"):
        with pytest.raises(ConfigurationError, match=re.escape(f"Policy({field}=...): expected")):
            Policy(**{field: name})
    for field in ("header_denylist", "header_allowlist"):
        with pytest.raises(ConfigurationError, match=re.escape(f"Policy({field}=...): expected")):
            Policy(**{field: ["etag", name]})


@pytest.mark.parametrize("methods", [[" POST"], ["P O S T"], ["POST\n"], ["PO:ST"], []])
def test_methods_that_guard_nothing_are_refused(methods: list[str]) -> None:
    with pytest.raises(ConfigurationError, match=re.escape("Policy(methods=...): expected")):
        Policy(methods=methods)  # type: ignore[arg-type]


def test_token_names_are_still_accepted() -> None:
    policy = Policy(
        header="X-Idempotency_Key.v2",
        retention_header="Idempotency-Retention",
        methods=["post", "M-SEARCH"],  # type: ignore[arg-type]
        header_allowlist=[],  # type: ignore[arg-type]  # store no response header
        header_denylist=["X-Secret"],  # type: ignore[arg-type]
    )
    assert policy.methods == frozenset({"POST", "M-SEARCH"})
    assert policy.header_allowlist == frozenset()


def test_a_prefix_that_redis_cannot_be_sent_is_refused() -> None:
    # What os.environ gives for a non-UTF-8 byte: on main the first call raised
    # UnicodeEncodeError.
    with pytest.raises(ConfigurationError, match=re.escape("Policy(prefix=...): expected")):
        Policy(prefix="billing\udcff")
    assert Policy(prefix="facturación").prefix == "facturación"


def test_positional_arguments_and_derived_fields_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="keyword"):
        Policy(10)  # type: ignore[misc]
    with pytest.raises(ConfigurationError, match=re.escape("Policy(lease_ms=...): not a Policy")):
        Policy().replace(lease_ms=5)


def test_an_async_event_hook_is_refused_not_silently_never_run() -> None:
    """on_event and render_problem are called synchronously: an async one's coroutine was
    never awaited, every event dropped (metrics and alerts dark, no sign but a warning)."""

    async def hook(event: object) -> None:  # pragma: no cover
        pass

    class AsyncHook:
        async def __call__(self, event: object) -> None:  # pragma: no cover
            pass

    for field in ("on_event", "render_problem"):
        for value in (hook, AsyncHook()):
            with pytest.raises(ConfigurationError, match="not async"):
                Policy(**{field: value})
    Policy(on_event=print)  # a plain callable is taken
