"""``idemkey doctor``: is this Redis fit to hold idempotency records?

The verdicts are :mod:`idemkey.diagnostics`'s; the server settings (eviction, persistence) are
read and parsed as :meth:`idemkey.RedisStore.check` reads them, with the store's own parsers.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from typing import IO, Any, Final

from ..store import diagnostics
from ..store.diagnostics import _text as text
from ._base import CliError, print_json
from ._redis import connect, info, redact

HELP: Final = "check that a Redis server is fit to hold records"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pings", type=int, default=20, help="PINGs for the round-trip median")


def server_settings(client: Any, node_info: dict[str, Any]) -> dict[str, str]:
    """``maxmemory-policy``, ``maxmemory``, ``save`` and ``appendonly`` (CONFIG GET names).

    From ``CONFIG GET``, or from INFO where CONFIG is disabled (managed services), parsed by
    the store's parsers so that ``doctor`` and ``store.check()`` read a server the same way.
    """
    import redis

    from ..store._server_check import _CONFIG_NAMES, _config_pairs, _info_settings

    settings: dict[str, str] = {}
    try:
        for name in _CONFIG_NAMES:
            settings.update(_config_pairs(client.config_get(name)))
    except redis.ResponseError:
        return _info_settings(node_info, node_info)  # one full INFO holds both sections
    return settings


def diagnose_node(client: Any, pings: int) -> list[diagnostics.Check]:
    """Every doctor check on one server."""
    from redis.exceptions import ResponseError

    from ..store import SCRIPTS

    node_info = info(client)
    checks = [diagnostics.check_version(node_info), diagnostics.check_mode(node_info)]
    if diagnostics.mode(node_info) == "sentinel":
        return checks  # a Sentinel answers none of the rest
    checks.append(diagnostics.check_role(node_info))
    settings = server_settings(client, node_info)
    checks.append(diagnostics.check_eviction(settings))
    checks.append(diagnostics.check_persistence(settings.get("save"), settings.get("appendonly")))
    loaded: dict[str, str | None] = {}
    for name, script in SCRIPTS.items():
        try:
            loaded[name] = text(client.script_load(script))
        except ResponseError:
            loaded[name] = None
    checks.append(diagnostics.check_scripts(loaded))
    samples = []
    for _ in range(pings):
        started = time.perf_counter()
        client.ping()
        samples.append(time.perf_counter() - started)
    checks.append(diagnostics.check_round_trip(samples))
    return checks


def _merge(
    per_node: list[tuple[str, list[diagnostics.Check]]],
) -> list[tuple[str, diagnostics.Check]]:
    """One line per check when every primary agrees, else one per primary."""
    if len(per_node) == 1:
        return [("", check) for check in per_node[0][1]]
    merged: list[tuple[str, diagnostics.Check]] = []
    names = list(dict.fromkeys(c.name for _, checks in per_node for c in checks))
    for name in names:
        rows = [(node, c) for node, checks in per_node for c in checks if c.name == name]
        same = {(c.verdict, c.detail) for _, c in rows}
        if len(same) == 1 and name != "round trip":
            merged.append((f"all {len(rows)} primaries", rows[0][1]))
        else:
            merged.extend(rows)
    return merged


def run(args: argparse.Namespace, out: IO[str]) -> int:
    if args.pings < 1:
        raise CliError("--pings must be >= 1", 2)
    with connect(args.redis_url) as server:
        per_node = [(node, diagnose_node(client, args.pings)) for node, client in server.nodes]
        mode_line = None
        if server.cluster:
            state = text(server.client.cluster_info().get("cluster_state", ""))
            verdict: diagnostics.Verdict = "OK" if state == "ok" else "FAIL"
            detail = f"cluster_state {state}, {len(server.nodes)} primaries"
            mode_line = diagnostics.Check("cluster", verdict, detail)
    lines = _merge(per_node)
    if mode_line is not None:
        lines.insert(0, ("", mode_line))
    verdict_all = diagnostics.worst([c for _, c in lines])
    if args.json:
        print_json(
            {
                "url": redact(args.redis_url),
                "verdict": verdict_all,
                "checks": [{"node": node, **asdict(c)} for node, c in lines],
            },
            out,
        )
    else:
        out.write(f"idemkey doctor: {redact(args.redis_url)}\n")
        for node, check in lines:
            where = f"  [{node}]" if node else ""
            out.write(f"{check.verdict:<5} {check.name:<17} {check.detail}{where}\n")
        out.write(f"verdict: {verdict_all}\n")
    return 1 if verdict_all == "FAIL" else 0
