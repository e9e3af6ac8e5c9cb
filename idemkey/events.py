"""Typed events for the ``on_event`` hook, and the ``idemkey`` logger.

An event names the record by digests only: the raw idempotency key and the request body are
client input (they may carry secrets) and never leave the library in an event or a log line.
A :class:`Reporting` (a :class:`Reporter`, an HTTP exchange) reports one request's (or one
guard's) events and uncertain outcomes.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ._core import Record
    from .store.uncertain import UncertainKind

    #: Where uncertain outcomes go: a store's ``keep_uncertain``.
    Keep = Callable[[UncertainKind, "Reporting", int | None, str, tuple[str, ...]], None]

__all__ = [
    "ALWAYS_LOGGED",
    "DEBUG",
    "Event",
    "EventKind",
    "RECORD_LOST_DETAIL",
    "Reporter",
    "Reporting",
    "TAKEN_OVER_DETAIL",
    "call_hook",
    "emit",
    "enabled_memo",
    "lease_lost_detail",
    "logger",
    "quiet",
    "report",
]

logger = logging.getLogger("idemkey")
# logging's memo of this logger's answers per level (level -> enabled), which logging clears in
# place whenever a level changes: reading it costs a dict lookup where Logger.isEnabledFor is a
# Python call on every event of every request. A logging without the memo: always ask.
enabled_memo: dict[int, bool] = getattr(logger, "_cache", {})
DEBUG = logging.DEBUG

EventKind = Literal[
    "claimed",
    "replayed",
    "in_flight",
    "mismatch",
    "completed",
    "released",
    "takeover",
    "lease_lost",
    "record_lost",
    "store_error",
    "unprotected",
    "too_large",
    "expired",
]

#: Kinds logged as warnings whether or not anyone listens.
ALWAYS_LOGGED: frozenset[str] = frozenset(
    {"lease_lost", "record_lost", "store_error", "unprotected"}
)

#: Why a claim was lost, as ``lease_lost`` and ``record_lost`` events say it.
TAKEN_OVER_DETAIL = "another executor took the record over"
_VANISHED = "the record vanished from Redis under a live claim"
_VANISHED_HOW = (
    "it was evicted (set maxmemory-policy noeviction), lost to a restart without persistence "
    "or a failover to a replica that had not received it (use AOF and Policy.durability), or "
    "deleted (FLUSHDB, FLUSHALL, a DEL)"
)
RECORD_LOST_DETAIL = (
    f"{_VANISHED}, so nothing of this run is stored and a retry runs the work again: "
    f"{_VANISHED_HOW}"
)


def lease_lost_detail(record_lost: bool, committed: tuple[int, bool] | None) -> str:
    """Why a claim was lost, and what it leaves: nothing, or (``committed``: the call's fenced
    row committed, and whether it holds the result) an effect a retry does not run again."""
    if committed is None:
        return RECORD_LOST_DETAIL if record_lost else TAKEN_OVER_DETAIL
    why = f"{_VANISHED}: {_VANISHED_HOW}" if record_lost else TAKEN_OVER_DETAIL
    if committed[1]:
        return (
            f"{why}; but this run's effect committed in the database with its result: a retry "
            "replays it and does not run the work again"
        )
    return (
        f"{why}; but this run's effect committed in the database without its result: a retry "
        "gets EffectCommittedError and does not run the work again"
    )


_WARNINGS = ALWAYS_LOGGED


def quiet(hook: Callable[[Event], None] | None) -> bool:
    """Whether an event that is not a warning would go nowhere: no hook, no debug logging.

    The hot paths inline it, ``hook is None and enabled_memo.get(DEBUG) is False``, to skip
    even the call; a memo that has no answer yet (None) falls back to asking the logger.
    """
    if hook is not None:
        return False
    enabled = enabled_memo.get(DEBUG)
    return not (logger.isEnabledFor(logging.DEBUG) if enabled is None else enabled)


@dataclass(frozen=True, slots=True)
class Event:
    """One thing idemkey did with one record.

    ``record`` is the record's digest (the same hex string inside the Redis key braces), so an
    operator can find the record with ``idemkey inspect`` without the raw key being logged.
    ``scope_digest`` is a short digest of the tenant scope. ``redis_seconds`` is the time spent
    in the Redis call that produced the event, when there was one.
    """

    kind: EventKind
    record: str
    route: str = ""
    method: str = ""
    scope_digest: str = ""
    fence: int | None = None
    redis_seconds: float | None = None
    detail: str = ""


def emit(hook: Callable[[Event], object] | None, event: Event) -> None:
    """Send ``event`` to ``hook`` and log it; a failing hook is logged, never raised."""
    if event.kind in _WARNINGS:
        # The heartbeat's events have no request: they name the record instead.
        logger.warning(
            "idemkey %s on %s %s: %s",
            event.kind,
            event.method or "record",
            event.route or event.record,
            event.detail,
            extra={"idemkey_event": event.kind, "idemkey_record": event.record},
        )
    elif logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "idemkey %s on %s %s",
            event.kind,
            event.method,
            event.route,
            extra={"idemkey_event": event.kind, "idemkey_record": event.record},
        )
    if hook is None:
        return
    try:
        call_hook(hook, event)
    except Exception:
        logger.exception("idemkey on_event hook raised; the request goes on")


#: The never-awaited warnings already logged (a hook's name and what it returned): each is
#: logged once, not per event; as many as the program has such hooks.
_logged: set[str] = set()


def call_hook(hook: Callable[[Event], object], event: Event) -> None:
    """Call ``hook`` with ``event`` (what it raises goes on). Work it returns that nobody will
    await (a coroutine: the hook is called synchronously) is closed, and said once per hook;
    a Task or Future is scheduled: left be. ``emit`` and ``contrib.chain`` call each hook so."""
    returned = hook(event)
    if returned is None or not inspect.isawaitable(returned) or asyncio.isfuture(returned):
        return  # a plain hook's None: the one test it costs on the request path
    close = getattr(returned, "close", None)
    if close is not None:
        close()  # the work is lost either way; closed, Python warns of nothing per event
    name = getattr(hook, "__qualname__", type(hook).__qualname__)
    what = getattr(returned, "__qualname__", type(returned).__qualname__)
    text = (
        f"idemkey on_event hook {name} returned {what}(), which is never awaited: the hook is "
        "called synchronously, so its async work is lost for every event (each is closed; "
        "this is logged once per hook). Make it a plain function that schedules the work "
        "itself (queue.put_nowait, loop.call_soon_threadsafe, loop.create_task)"
    )
    if text not in _logged:
        _logged.add(text)
        logger.warning("%s", text)


class Reporting:
    """What reports one request's (or one guard's) events, to ``hook`` and the logger, and its
    uncertain outcomes, to ``keep`` (a store's ``keep_uncertain``; None: not kept).

    It holds where they come from once: the ``record``, the ``scope``, the ``method``, the
    ``route`` the record is named by, and the ``label`` an event names it by (an HTTP event
    says a route template or ``<unknown>``, never a concrete path: a metric label must stay
    bounded). The methods only: :class:`Reporter` keeps the attributes in slots (the guards'
    ``GuardState`` is one), :class:`~idemkey.http.Exchange` in its Struct's fields.
    """

    __slots__ = ()

    hook: Callable[[Event], None] | None
    keep: Keep | None
    label: str
    method: str
    record: Record
    route: str
    scope: str

    def notify(
        self,
        kind: EventKind,
        fence: int | None = None,
        detail: str = "",
        seconds: float | None = None,
    ) -> None:
        """Build and emit an event, unless nobody listens (the hot path then costs one check).

        ``seconds`` is the time the Redis call behind the event took, when there was one.
        """
        hook = self.hook
        if hook is None and kind not in _WARNINGS and enabled_memo.get(DEBUG) is False:
            return  # nobody listens: this one check is all an event costs
        if kind not in _WARNINGS and quiet(hook):
            return
        scope_digest = hashlib.blake2b(
            self.scope.encode("utf-8", "surrogatepass"), digest_size=6
        ).hexdigest()
        record = self.record.digest
        emit(
            hook, Event(kind, record, self.label, self.method, scope_digest, fence, seconds, detail)
        )

    def uncertain(
        self,
        kind: UncertainKind,
        fence: int | None = None,
        detail: str = "",
        steps: tuple[str, ...] = (),
    ) -> None:
        """Keep an outcome an operator must check in the store's stream (never raises)."""
        keep = self.keep
        if keep is not None:
            keep(kind, self, fence, detail, steps)


class Reporter(Reporting):
    """A :class:`Reporting` with its attributes in slots: the guards' ``GuardState`` is one
    (it sets them in its own ``__init__``: one Python call less per guard), and an event with
    no request of its own (the heartbeat's ``record_lost``) is reported through one."""

    __slots__ = ("hook", "keep", "label", "method", "record", "route", "scope")

    def __init__(
        self,
        hook: Callable[[Event], None] | None,
        record: Record,
        scope: str = "",
        method: str = "",
        route: str = "",
        keep: Keep | None = None,
    ) -> None:
        self.hook = hook
        self.record = record
        self.scope = scope
        self.method = method
        self.route = self.label = route
        self.keep = keep


def report(
    hook: Callable[[Event], None] | None,
    kind: EventKind,
    record: Record,
    scope: str,
    method: str,
    route: str,
    fence: int | None = None,
    detail: str = "",
    seconds: float | None = None,
) -> None:
    """Build and emit one event, unless nobody listens: :meth:`Reporter.notify` for an event
    with no reporter of its own (the heartbeat's ``record_lost``)."""
    if kind not in _WARNINGS and quiet(hook):
        return
    Reporter(hook, record, scope, method, route).notify(kind, fence, detail, seconds)
