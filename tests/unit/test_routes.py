"""Route selection (idemkey.routes), sans-IO: which requests are guarded, with which policy."""

from __future__ import annotations

import pytest

from idemkey import ConfigurationError, Policy
from idemkey.routes import Routes, Selected, exempt, route

BASE = Policy(prefix="t")


def select(routes: Routes, method: str, path: str) -> Selected | None:
    return routes.bind(BASE).select(method, path)


def test_only_declared_routes_are_guarded() -> None:
    routes = Routes("/charges", route("/charges/{charge_id}/refund"))
    assert select(routes, "POST", "/charges") == Selected("/charges", BASE)
    chosen = select(routes, "POST", "/charges/ch_1/refund")
    assert chosen is not None
    assert chosen.route == "/charges/{charge_id}/refund"  # the template, never the path
    assert select(routes, "POST", "/login") is None
    assert select(routes, "POST", "/charges/") is None
    assert select(routes, "POST", "/charges/a/b/refund") is None  # {name} is one segment
    assert select(routes, "POST", "/charges//refund") is None  # ... and never empty


def test_methods_come_from_the_route_policy() -> None:
    routes = Routes("/charges", route("/jobs", methods=["put", "post"]))
    assert select(routes, "GET", "/charges") is None
    assert select(routes, "PATCH", "/charges") is not None
    jobs = select(routes, "PUT", "/jobs")
    assert jobs is not None
    assert jobs.policy.methods == frozenset({"PUT", "POST"})
    assert select(routes, "PATCH", "/jobs") is None


def test_options_derive_one_policy_per_route_at_bind_time() -> None:
    table = Routes(route("/slow", ttl=3600, wait=2.0, required=False), "/fast").bind(BASE)
    slow, fast = table.select("POST", "/slow"), table.select("POST", "/fast")
    assert slow is not None
    assert fast is not None
    assert (slow.policy.ttl, slow.policy.wait, slow.policy.require_key) == (3600, 2.0, False)
    assert slow.policy.prefix == "t"  # everything else is the middleware's policy
    assert fast.policy is BASE
    assert table.select("POST", "/slow") is slow  # no per-request derivation


def test_exemptions_win_over_any_guarded_match() -> None:
    routes = Routes(route("/v1/{rest:path}"), exempt("/v1/login"), exempt("/v1/hooks/{name}"))
    assert select(routes, "POST", "/v1/charges/ch_1") is not None
    assert select(routes, "POST", "/v1/login") is None
    assert select(routes, "POST", "/v1/hooks/stripe") is None
    assert select(routes, "POST", "/v1/hooks/stripe/extra") is not None


def test_a_literal_route_beats_a_template_then_the_first_template_wins() -> None:
    routes = Routes(
        route("/charges/{charge_id}", ttl=100),
        route("/charges/{other}", ttl=200),
        route("/charges/search", ttl=300),
    )
    literal = select(routes, "POST", "/charges/search")
    first = select(routes, "POST", "/charges/ch_9")
    assert literal is not None
    assert literal.policy.ttl == 300
    assert first is not None
    assert (first.route, first.policy.ttl) == ("/charges/{charge_id}", 100)


def test_pattern_text_is_literal_not_a_regex() -> None:
    routes = Routes("/a.b/{x}", "/c+d")
    assert select(routes, "POST", "/a.b/1") is not None
    assert select(routes, "POST", "/aXb/1") is None
    assert select(routes, "POST", "/c+d") is not None
    assert select(routes, "POST", "/ccd") is None


@pytest.mark.parametrize(
    "bad",
    ["charges", "", "/charges/{id", "/charges/id}", "/c/{x}/{x}", "/c/{x:int}", "/c/{1x}"],
)
def test_malformed_patterns_are_refused_when_declared(bad: str) -> None:
    with pytest.raises(ConfigurationError):
        route(bad)


def test_unknown_options_are_refused_when_declared() -> None:
    with pytest.raises(ConfigurationError, match=r"route\('/charges', tll=...\): not a Policy"):
        route("/charges", tll=5)
    with pytest.raises(ConfigurationError, match="methods"):
        route("/charges", methods="POST")
    with pytest.raises(ConfigurationError):
        Routes(42)  # type: ignore[arg-type]


def test_invalid_option_values_fail_at_bind_with_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        Routes(route("/charges", lease=0)).bind(BASE)
