"""What the console shows, read from a store: one SCAN of the prefix per refresh.

A record's scope is not shown as stored when it is a digest: the default scope is an unkeyed
BLAKE2b of the request's credential headers, so a weak password (HTTP Basic's
``user:password``) is found from it offline by a dictionary, in milliseconds. The console
shows a :class:`ScopeLabels` label instead, keyed by a secret of the console process: stable
while it runs, so the rows of one tenant still read alike, and nothing to guess against. A
scope the app set (``Policy.scope``: its tenant id, an account or API-key id, never a secret
per docs/behaviour.md "Set scope") is shown as it is, as ``idemkey list`` prints it.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

from .._core import is_digest
from .._core._origin import printable_text
from ..errors import StoreError
from ..http._scope import NO_CREDENTIALS
from ..store import STATES, RecordStatus, RedisStore
from ..store.uncertain import UncertainEntry, action_now

__all__ = ["MAX_LISTED", "ScopeLabels", "Snapshot", "snapshot"]

#: At most this many records of each list (active, released with steps), and routes, are shown.
MAX_LISTED: Final = 200
#: The latest uncertain outcomes shown.
MAX_UNCERTAIN: Final = 50


@dataclass(frozen=True)
class Snapshot:
    """The records under a prefix at one moment: counts, and the ones an operator looks at."""

    prefix: str
    taken_at: float
    seconds: float
    counts: dict[str, int]
    routes: list[tuple[str, dict[str, int]]]
    active: list[RecordStatus] = field(default_factory=list)
    stepped: list[RecordStatus] = field(default_factory=list)
    uncertain: list[UncertainEntry] = field(default_factory=list)
    truncated: bool = False
    #: The state now of each uncertain entry's record (by digest; absent: gone).
    now: dict[str, str] = field(default_factory=dict)
    #: Why the uncertain outcomes could not be read ("": they were).
    uncertain_error: str = ""

    def state_now(self, entry: UncertainEntry) -> str:
        """The entry's record's state now, "gone" when it expired or was forgotten."""
        return self.now.get(entry.digest, "gone")

    def _entry(self, e: UncertainEntry) -> dict[str, Any]:
        now = {"action": self.action_now(e), "state_now": self.state_now(e)}
        return {**asdict(e), "meaning": e.meaning, **now}

    def action_now(self, entry: UncertainEntry) -> str:
        """What to do about ``entry`` given its record's state now (``action_now``)."""
        return action_now(entry.kind, self.now.get(entry.digest))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "taken_at": self.taken_at,
            "seconds": round(self.seconds, 3),
            "counts": self.counts,
            "routes": [{"route": route, "counts": counts} for route, counts in self.routes],
            "active": [asdict(s) for s in self.active],
            "released_with_steps": [asdict(s) for s in self.stepped],
            "uncertain": [self._entry(e) for e in self.uncertain],
            "uncertain_error": self.uncertain_error,
            "truncated": self.truncated,
        }


class ScopeLabels:
    """What the console shows for a scope: a digest (the default scope, or one like it) as
    ``cred:`` and 12 hex digits of a BLAKE2b keyed by 16 random bytes made here, once per
    console; the default scope of a request without credentials as such; any other as it is."""

    def __init__(self) -> None:
        self._key = os.urandom(16)

    def __call__(self, scope: str) -> str:
        if scope == NO_CREDENTIALS:  # a constant anyone can compute: nothing to hide
            return "(no credentials)"
        if not is_digest(scope):
            return scope
        keyed = hashlib.blake2b(scope.encode(), key=self._key, digest_size=6)
        return "cred:" + keyed.hexdigest()


def _origin(status: RecordStatus) -> str:
    # A completed record keeps no origin (its memory goal): counted apart. A label, not data:
    # escaped here as `idemkey list` prints a route, so the template shows it as it is.
    if not (status.method or status.route):
        return "(completed: route not kept)" if status.state == "complete" else "(unknown)"
    return f"{printable_text(status.method)} {printable_text(status.route)}".strip()


def _top_routes(by_route: dict[str, Counter[str]]) -> list[tuple[str, dict[str, int]]]:
    """The busiest :data:`MAX_LISTED` routes, the others folded into one row: without
    ``routes=`` a route is the request's path, one new row per request a client makes up."""
    ranked = sorted(by_route.items(), key=lambda item: (-item[1].total(), item[0]))
    shown = [(route, dict(c)) for route, c in ranked[:MAX_LISTED]]
    if len(ranked) > MAX_LISTED:
        rest: Counter[str] = Counter()
        for _, c in ranked[MAX_LISTED:]:
            rest.update(c)
        shown.append((f"({len(ranked) - MAX_LISTED} other routes)", dict(rest)))
    return shown


def snapshot(store: RedisStore, labels: ScopeLabels | None = None) -> Snapshot:
    """Count and sort every record under the store's prefix (SCAN, one page in memory), each
    scope as ``labels`` shows it (a console keeps one :class:`ScopeLabels`; None: new ones)."""
    label = labels or ScopeLabels()
    started = time.perf_counter()
    counts: Counter[str] = Counter(dict.fromkeys(STATES, 0))
    by_route: dict[str, Counter[str]] = {}
    active: list[RecordStatus] = []
    stepped: list[RecordStatus] = []
    truncated = False
    # The uncertain entries first: the scan below also reads their records' states now, so
    # their advice follows what happened since (a retry that completed one, say). A stream
    # that cannot be read (another type at its name: a stranger's key under the prefix) is
    # said, and the records shown all the same; a Redis that fails fails the scan below too.
    try:
        uncertain = store.uncertain(limit=MAX_UNCERTAIN)
        uncertain_error = ""
    except StoreError as exc:
        uncertain, uncertain_error = [], str(exc)
    uncertain = [replace(entry, scope=label(entry.scope)) for entry in uncertain]
    wanted = {entry.digest for entry in uncertain}
    now: dict[str, str] = {}
    for status in store.records():
        if status.digest in wanted:
            now[status.digest] = status.state
        counts[status.state] += 1
        by_route.setdefault(_origin(status), Counter())[status.state] += 1
        if status.state in ("in_progress", "lapsed"):
            if len(active) < MAX_LISTED:
                active.append(replace(status, scope=label(status.scope)))
            else:
                truncated = True
        elif status.state == "released" and status.steps:
            if len(stepped) < MAX_LISTED:
                stepped.append(replace(status, scope=label(status.scope)))
            else:
                truncated = True
    # Lapsed first (someone should look), then the oldest in flight.
    active.sort(key=lambda s: (s.state != "lapsed", -(s.age or 0.0)))
    routes = _top_routes(by_route)
    truncated = truncated or len(by_route) > MAX_LISTED
    return Snapshot(
        prefix=store.policy.prefix,
        taken_at=time.time(),
        seconds=time.perf_counter() - started,
        counts=dict(counts),
        routes=routes,
        active=active,
        stepped=stepped,
        uncertain=uncertain,
        truncated=truncated,
        now=now,
        uncertain_error=uncertain_error,
    )
