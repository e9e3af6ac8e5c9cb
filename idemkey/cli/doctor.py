"""``idemkey doctor``: is this Redis fit to hold idempotency records?

The verdicts are :mod:`idemkey.diagnostics`'s; the server settings (eviction, persistence) are
read and parsed as :meth:`idemkey.RedisStore.check` reads them, with the store's own parsers.
"""

from __future__ import annotations

import argparse
import hashlib
import secrets
import time
from collections.abc import Collection
from dataclasses import asdict
from typing import IO, Any, Final

from ..store import diagnostics
from ..store._url import redacted
from ..store.diagnostics import _text as text
from ._base import CliError, print_json
from ._redis import connect, explain_redis_error, info
from .readable import shown

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


def diagnose_node(
    client: Any, pings: int, prefix: str = "idemkey", slots: Collection[int] | None = None
) -> list[diagnostics.Check]:
    """Every doctor check on one server. ``slots``: the hash slots the node serves, on a
    cluster (None: a standalone server, any key is its own)."""
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
    expected = {name: hashlib.sha1(script.encode()).hexdigest() for name, script in SCRIPTS.items()}
    refused = None
    if (loaded["forget"] or "").lower() == expected["forget"]:
        refused = forget_refused(client, expected["forget"], _absent_key(prefix, slots))
    checks.append(diagnostics.check_scripts(loaded, expected, refused))
    samples = []
    for _ in range(pings):
        started = time.perf_counter()
        client.ping()
        samples.append(time.perf_counter() - started)
    checks.append(diagnostics.check_round_trip(samples))
    return checks


def forget_refused(client: Any, sha: str, key: str | None) -> str | None:
    """Why ``EVALSHA`` of forget.lua fails on this server, None when it runs (or ``key`` is
    None: the node serves no slot to run it in).

    SCRIPT LOAD passing says nothing of EVALSHA: an ACL may allow one and not the other, and a
    replica loads scripts it cannot run. forget.lua, force off, on a record that does not exist
    reads it, deletes nothing and answers ``{0, ""}``: it writes nothing (DEL of a missing key
    changes no data and is not replicated), under the records' prefix, which an ACL's key
    pattern for idemkey allows.
    """
    from redis.exceptions import AskError, ResponseError

    if key is None:
        return None
    try:
        reply = client.evalsha(sha, 1, key, "0")
    except AskError:
        return None  # the slot moved since the cluster was read: nothing said about scripts
    except ResponseError as exc:
        return f"EVALSHA forget: {explain_redis_error(exc)}"
    if isinstance(reply, list) and len(reply) == 2 and reply[0] == 0 and text(reply[1]) == "":
        return None
    return f"EVALSHA forget answered {reply!r}, not forget.lua's answer for no record"


def _absent_key(prefix: str, slots: Collection[int] | None) -> str | None:
    """A name under ``prefix`` that no record has (a record's hash tag is a digest, never
    "doctor-..."; 64 random bits keep it from anyone's key), in one of ``slots`` when given:
    a node answers MOVED for a key in another's. None when ``slots`` is empty."""
    from redis.crc import key_slot

    if slots is not None and not slots:
        return None
    # A random tag falls into the node's slots once in 16384/len(slots) tries on average; the
    # bound only keeps a broken slot map from looping for ever.
    for _ in range(1_000_000):
        key = f"{prefix}:{{doctor-{secrets.token_hex(8)}}}"
        if slots is None or key_slot(key.encode()) in slots:
            return key
    return None  # pragma: no cover - about 1 chance in e**61 for a node with one slot


def _slots(server: Any) -> dict[str, frozenset[int]]:
    """The hash slots each primary of a cluster serves, by its "host:port" (as connect names
    it), from the cluster client's slot map."""
    owned: dict[str, set[int]] = {}
    for slot, holders in server.client.nodes_manager.slots_cache.items():
        if holders:
            owned.setdefault(f"{holders[0].host}:{holders[0].port}", set()).add(slot)
    return {node: frozenset(slots) for node, slots in owned.items()}


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
        slots = _slots(server) if server.cluster else None
        per_node = [
            (node, diagnose_node(client, args.pings, args.prefix,
                                 None if slots is None else slots.get(node, frozenset())))
            for node, client in server.nodes
        ]  # fmt: skip
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
                "url": redacted(args.redis_url),
                "verdict": verdict_all,
                "checks": [{"node": node, **asdict(c)} for node, c in lines],
            },
            out,
        )
    else:
        out.write(f"idemkey doctor: {redacted(args.redis_url)}\n")
        for node, check in lines:
            # The details quote what the server reports (its version, role, settings, errors):
            # escaped, so an impostor on the URL cannot drive the operator's terminal.
            where = f"  [{shown(node)}]" if node else ""
            out.write(f"{check.verdict:<5} {check.name:<17} {shown(check.detail)}{where}\n")
        out.write(f"verdict: {verdict_all}\n")
    return 1 if verdict_all == "FAIL" else 0
