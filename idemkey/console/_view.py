"""What the console shows, read from a store: one SCAN of the prefix per refresh."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from ..store import STATES, RecordStatus, RedisStore
from ..store.uncertain import UncertainEntry, action_now

__all__ = ["MAX_LISTED", "Snapshot", "snapshot"]

#: At most this many records of each list (active, released with steps) are shown.
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
            "truncated": self.truncated,
        }


def _origin(status: RecordStatus) -> str:
    # A completed record keeps no origin (its memory goal): counted apart.
    if not (status.method or status.route):
        return "(completed: route not kept)" if status.state == "complete" else "(unknown)"
    return f"{status.method} {status.route}".strip()


def snapshot(store: RedisStore) -> Snapshot:
    """Count and sort every record under the store's prefix (SCAN, one page in memory)."""
    started = time.perf_counter()
    counts: Counter[str] = Counter(dict.fromkeys(STATES, 0))
    by_route: dict[str, Counter[str]] = {}
    active: list[RecordStatus] = []
    stepped: list[RecordStatus] = []
    truncated = False
    # The uncertain entries first: the scan below also reads their records' states now, so
    # their advice follows what happened since (a retry that completed one, say).
    uncertain = store.uncertain(limit=MAX_UNCERTAIN)
    wanted = {entry.digest for entry in uncertain}
    now: dict[str, str] = {}
    for status in store.records():
        if status.digest in wanted:
            now[status.digest] = status.state
        counts[status.state] += 1
        by_route.setdefault(_origin(status), Counter())[status.state] += 1
        if status.state in ("in_progress", "lapsed"):
            if len(active) < MAX_LISTED:
                active.append(status)
            else:
                truncated = True
        elif status.state == "released" and status.steps:
            if len(stepped) < MAX_LISTED:
                stepped.append(status)
            else:
                truncated = True
    # Lapsed first (someone should look), then the oldest in flight.
    active.sort(key=lambda s: (s.state != "lapsed", -(s.age or 0.0)))
    routes = sorted(
        ((route, dict(c)) for route, c in by_route.items()), key=lambda item: -sum(item[1].values())
    )
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
    )
