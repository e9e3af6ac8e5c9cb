"""Sans-IO server checks: a verdict from what Redis reports, without talking to Redis.

``idemkey doctor`` gathers ``INFO``, ``CONFIG GET`` answers and timings and hands them to the
functions here; a store (or your own health check) can call them with the same dicts. Every
function takes plain values (what redis-py returns, ``str`` or ``bytes``) and returns a
:class:`Check`, or, for :func:`eviction_warning`, the warning text or ``None``.

Why these checks:

* **Eviction.** Every record carries a TTL, so ``volatile-*`` policies evict records just as
  ``allkeys-*`` do. An evicted record means a retry runs the handler a second time: exactly
  what idemkey exists to prevent. Only ``noeviction`` keeps records until their retention ends
  (a full server then answers writes with an error, which idemkey turns into a 503).
* **Persistence.** Without RDB save points or AOF, a restart forgets every record, and every
  retry after it runs again.
* **Version.** Waiters block on a stream that complete.lua and release.lua post to, ``XREAD``
  and ``XADD``, which Redis has from 5.0 on.
* **Role.** A replica is read-only: every claim would fail.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from .._core._stored import stored_int

__all__ = [
    "MIN_VERSION",
    "Check",
    "Verdict",
    "check_eviction",
    "check_mode",
    "check_persistence",
    "check_role",
    "check_round_trip",
    "check_scripts",
    "check_version",
    "eviction_warning",
    "mode",
    "worst",
]

Verdict = Literal["OK", "WARN", "FAIL"]
_RANK: Final[dict[Verdict, int]] = {"OK": 0, "WARN": 1, "FAIL": 2}

#: The oldest Redis idemkey runs on: the waiters' stream, XADD and XREAD BLOCK, came in 5.0.
MIN_VERSION: Final = (5, 0)
#: Redis 6.2 and older reach end of life; 7.0 is what idemkey is tested on.
TESTED_VERSION: Final = (7, 0)
#: A round trip above this costs every first request two of them: worth a warning.
SLOW_ROUND_TRIP_MS: Final = 5.0


@dataclass(frozen=True, slots=True)
class Check:
    """One line of a diagnosis: what was checked, the verdict, and why."""

    name: str
    verdict: Verdict
    detail: str


def worst(checks: Sequence[Check]) -> Verdict:
    """The most severe verdict among ``checks`` (``OK`` for none)."""
    return max((c.verdict for c in checks), key=_RANK.__getitem__, default="OK")


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for part in version.split("."):
        # ASCII digits only: str.isdigit() also passes "²", which int() refuses, and other
        # scripts' digits, which int() reads as another number.
        digits = "".join(c for c in part if c.isascii() and c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_version(info: Mapping[str, object]) -> Check:
    """The server version from ``INFO server`` (``redis_version``; Valkey reports one too)."""
    raw = _text(info.get("redis_version"))
    version = _version_tuple(raw)
    name = "server version"
    server = "valkey" if info.get("valkey_version") is not None else "redis"
    shown = f"{server} {_text(info.get('valkey_version')) or raw}"
    if not version:
        return Check(name, "WARN", f"{shown!r}: cannot tell the version")
    if version < MIN_VERSION:
        need = ".".join(map(str, MIN_VERSION))
        return Check(name, "FAIL", f"{shown}: the scripts need Redis >= {need}")
    if version < TESTED_VERSION:
        return Check(name, "WARN", f"{shown}: works, but idemkey is tested on 7.0 and later")
    return Check(name, "OK", shown)


def mode(info: Mapping[str, object]) -> str:
    """``standalone``, ``cluster`` or ``sentinel``, from ``INFO`` (``redis_mode``)."""
    reported = _text(info.get("redis_mode"))
    if reported in ("standalone", "cluster", "sentinel"):
        return reported
    return "cluster" if _text(info.get("cluster_enabled")) == "1" else "standalone"


def check_mode(info: Mapping[str, object]) -> Check:
    """Whether this server can hold records: a Sentinel only knows where the primary is."""
    found = mode(info)
    if found == "sentinel":
        return Check(
            "mode",
            "FAIL",
            "sentinel: this is a Sentinel, not a data node; connect to the primary it names "
            "(redis.sentinel.Sentinel(...).master_for(name))",
        )
    return Check("mode", "OK", found)


def check_role(info: Mapping[str, object]) -> Check:
    """A replica cannot run the scripts: they write."""
    role = _text(info.get("role")) or "unknown"
    if role in ("slave", "replica"):
        return Check("role", "FAIL", f"{role}: read-only; point idemkey at the primary")
    return Check("role", "OK", role)


def eviction_warning(policy: str | bytes, maxmemory: int | str | bytes | None = None) -> str | None:
    """The warning for a ``maxmemory-policy`` that can evict records, or ``None``.

    Any policy but ``noeviction`` can drop a record before its retention ends (records carry a
    TTL, so ``volatile-*`` policies pick them as well), and the retry then runs again.
    ``maxmemory`` (bytes, ``0`` = no limit) only sharpens the message.
    """
    name = _text(policy).strip().lower()
    if name == "noeviction":
        return None
    limit = _text(maxmemory).strip()
    when = (
        "once maxmemory is set"
        if limit in ("0", "")
        else f"when memory reaches maxmemory ({_limit(limit)})"
    )
    return (
        f"maxmemory-policy is {name or 'unknown'}: {when}, Redis may evict idempotency records "
        "before their retention ends, and a retry then runs the handler again; "
        "use noeviction (records carry a TTL, so volatile-* policies evict them too)"
    )


def _limit(text: str) -> str:
    """A ``maxmemory`` as a size when it is a number of bytes; else as the server gave it
    (``4gb`` from a proxy or an older server; ``str.isdigit`` also passes ``"²"``)."""
    number = stored_int(text)
    return text if number is None else _size(number)


def check_eviction(info_or_config: Mapping[str, object]) -> Check:
    """``maxmemory-policy`` from ``INFO memory`` (``maxmemory_policy``) or ``CONFIG GET``."""
    policy = info_or_config.get("maxmemory_policy", info_or_config.get("maxmemory-policy"))
    maxmemory = info_or_config.get("maxmemory")
    name = "maxmemory-policy"
    if policy is None:
        return Check(name, "WARN", "the server does not report its eviction policy")
    warning = eviction_warning(_text(policy), _text(maxmemory) if maxmemory is not None else None)
    if warning is None:
        limit = _text(maxmemory).strip()
        shown = "no maxmemory" if limit in ("", "0") else f"maxmemory {_limit(limit)}"
        return Check(name, "OK", f"noeviction ({shown})")
    return Check(name, "WARN", warning)


def check_persistence(save: str | bytes | None, appendonly: str | bytes | None) -> Check:
    """RDB save points (``CONFIG GET save``) or AOF (``appendonly``); ``None``: not readable."""
    name = "persistence"
    if save is None and appendonly is None:
        return Check(
            name,
            "WARN",
            "cannot read the save/appendonly settings (CONFIG disabled?); make sure records "
            "survive a restart",
        )
    aof = _text(appendonly).strip().lower() in ("yes", "1")
    points = _text(save).split()
    rdb = bool(points)
    if aof and rdb:
        return Check(name, "OK", f"AOF and RDB (save {' '.join(points)})")
    if aof:
        return Check(name, "OK", "AOF")
    if rdb:
        return Check(
            name,
            "OK",
            f"RDB (save {' '.join(points)}): records written since the last snapshot are lost "
            "in a crash",
        )
    return Check(
        name,
        "WARN",
        "neither RDB save points nor AOF: a restart forgets every record, and retries after "
        "it run again",
    )


def check_scripts(
    loaded: Mapping[str, str | None],
    expected: Mapping[str, str] | None = None,
    refused: str | None = None,
) -> Check:
    """``SCRIPT LOAD`` results: script name -> the SHA1 the server answered (None: it failed).

    ``expected``: each script's own SHA1 (of its text; ``hashlib.sha1(text).hexdigest()``): a
    server answering another did not load it, whatever it says. ``refused``: why running a
    loaded script failed (an ACL that allows ``SCRIPT LOAD`` but not ``EVALSHA``, a read-only
    replica: every claim fails the same way), None when it ran or was not tried.
    """
    name = "scripts"
    failed = [script for script, sha in loaded.items() if not sha]
    if failed:
        return Check(name, "FAIL", f"SCRIPT LOAD failed for {', '.join(failed)}")
    known = expected or {}
    wrong = [
        script
        for script, sha in loaded.items()
        if script in known and (sha or "").lower() != known[script].lower()
    ]
    if wrong:
        return Check(
            name,
            "FAIL",
            f"SCRIPT LOAD answered a SHA1 that is not the script's for {', '.join(wrong)}: "
            "this server did not load what it was sent",
        )
    if refused is not None:
        return Check(
            name, "FAIL", f"the scripts load but cannot run ({refused}): every claim fails"
        )
    return Check(name, "OK", f"{len(loaded)} scripts load ({', '.join(loaded)})")


def check_round_trip(samples_seconds: Sequence[float]) -> Check:
    """Median ``PING`` time; each first request pays two round trips, a replay one."""
    name = "round trip"
    if not samples_seconds:
        return Check(name, "FAIL", "no PING answered")
    median_ms = statistics.median(samples_seconds) * 1000
    worst_ms = max(samples_seconds) * 1000
    shown = f"median {median_ms:.3f} ms, max {worst_ms:.3f} ms over {len(samples_seconds)} PINGs"
    if median_ms > SLOW_ROUND_TRIP_MS:
        return Check(name, "WARN", f"{shown}: every first request pays two of these")
    return Check(name, "OK", shown)


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
