"""Drive an :class:`~idemkey.http.Exchange` to its claim's answer, as an adapter does."""

from __future__ import annotations

from idemkey._core import ExpiringDecision
from idemkey.http import Exchange, Response

__all__ = ["decided"]


def decided(step: Exchange, decision: ExpiringDecision, body: bytes = b"") -> Response | None:
    """What ``step`` answers when its claim gets ``decision`` (None: the app runs, and the
    claim's call is current until ``step`` finishes or fails). ``body`` is the request's."""
    assert step.received(body) is None
    step.claiming()
    return step.decide(decision)
