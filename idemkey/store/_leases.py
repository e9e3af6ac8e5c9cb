"""Which live claims need their lease renewed, and when. Pure bookkeeping, no I/O, no locks.

The stores' heartbeats (one thread, or one task per event loop, for all of a store's claims)
ask this table what is due, renew it, and report back. A claim is renewed every lease/3, so
two renewals can fail in a row before the lease lapses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._core import Record

__all__ = ["Lease", "LeaseTable"]

# After a failed renewal (Redis hiccup), try again soon rather than a full third later.
_RETRY_FRACTION = 10


@dataclass(eq=False, slots=True)
class Lease:
    record: Record
    owner: str
    lease_ms: int
    due: float = field(default=0.0)
    #: The claim's fence, sent with each renewal so that renew.lua can tell a record lost
    #: under the claim (evicted, deleted) from one taken over.
    fence: int | None = None


class LeaseTable:
    def __init__(self) -> None:
        self._leases: dict[tuple[str, str], Lease] = {}
        # Failed renewals in a row, per lease failing now (kept here, not on Lease: a claim
        # builds its Lease on the hot path). Pruned by ``due``, never by ``remove``, for that.
        self._failing: dict[Lease, int] = {}

    def __len__(self) -> int:
        return len(self._leases)

    def add(
        self, record: Record, owner: str, lease_ms: int, now: float, fence: int | None = None
    ) -> float:
        """Track a new claim; returns when it is first due for renewal."""
        lease = Lease(record, owner, lease_ms, now + lease_ms / 3000, fence)
        self._leases[(record.record_key, owner)] = lease
        return lease.due

    def remove(self, record: Record, owner: str) -> Lease | None:
        """Stop renewing a claim; returns its lease, if it was being renewed."""
        return self._leases.pop((record.record_key, owner), None)

    def holds(self, lease: Lease) -> bool:
        """Whether ``lease`` is still live (not completed or released while it was renewed)."""
        return self._leases.get((lease.record.record_key, lease.owner)) is lease

    def next_due(self) -> float | None:
        return min((lease.due for lease in self._leases.values()), default=None)

    def due(self, now: float) -> list[Lease]:
        if self._failing:  # forget the failing leases completed or lost since
            self._failing = {lease: n for lease, n in self._failing.items() if self.holds(lease)}
        return [lease for lease in self._leases.values() if lease.due <= now]

    def failures(self, lease: Lease) -> int:
        """How many renewals of ``lease`` have failed in a row, up to now."""
        return self._failing.get(lease, 0)

    def renewed(self, lease: Lease, now: float) -> None:
        lease.due = now + lease.lease_ms / 3000
        if self._failing:
            self._failing.pop(lease, None)

    def failed(self, lease: Lease, now: float) -> None:
        lease.due = now + lease.lease_ms / 1000 / _RETRY_FRACTION
        self._failing[lease] = self._failing.get(lease, 0) + 1

    def answered(self, lease: Lease, ours: bool | None, now: float) -> bool:
        """Take a renewal's answer: True (renewed), None (failed: try again soon) or False
        (another owner has the record: stop). Returns whether the lease was lost just now.

        A lease completed or released while its renewal was on the way is not touched: the
        answer means nothing any more.
        """
        if not self.holds(lease):
            return False
        if ours is None:
            self.failed(lease, now)
        elif ours:
            self.renewed(lease, now)
        else:
            self.remove(lease.record, lease.owner)
            return True
        return False

    def clear(self) -> None:
        self._leases.clear()
        self._failing.clear()
