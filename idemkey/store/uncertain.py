"""The uncertain outcomes: what an operator must reconcile by hand, kept in Redis.

Six outcomes leave the work's effect in doubt. Besides its event, each is appended to one
capped stream per prefix, ``<prefix>:uncertain`` (``XADD MAXLEN ~`` :data:`MAX_ENTRIES`, the
stream living as long as the records: the policy's retention from its last entry), which
``store.uncertain()``, ``idemkey list --uncertain`` and the console read. Sans-IO: the fields
of an entry, and an entry read back. The stores write an entry off the request's path (a task,
or the store's writer thread): a slow or failing Redis loses the entry, never delays or fails
the request that caused it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from .._core._stored import stored_int
from .diagnostics import _text as text

__all__ = [
    "MAX_ENTRIES",
    "MAX_PENDING",
    "MEANINGS",
    "RETRY_SECONDS",
    "SINCE",
    "UncertainEntry",
    "UncertainKind",
    "action_now",
    "decode_entry",
    "entry_fields",
    "uncertain_stream",
]

UncertainKind = Literal[
    "lease_lost",
    "completion_failed",
    "unprotected",
    "released_with_steps",
    "takeover",
    "cancelled",
]

#: What each kind means, and what to do about it (docs/operators.md says the same).
MEANINGS: Final[dict[str, tuple[str, str]]] = {
    "lease_lost": (
        "the work ran, but its claim was taken over (or its record vanished) before its "
        "result was stored: another executor may have run it too",
        "check the side effects happened once; the other executor's answer is the one stored",
    ),
    "completion_failed": (
        "the handler answered, but Redis failed to store the answer: the record stays in "
        "progress until its lease lapses, and a retry after that runs the work again",
        "check the side effect before the retry runs, or store the outcome by hand",
    ),
    "unprotected": (
        "Redis failed and on_store_error='open' ran the work with no claim: a duplicate of "
        "this request may have run it a second time",
        "look for a duplicate of the operation (same key) and undo one",
    ),
    "released_with_steps": (
        "the call failed after some steps finished; the record keeps them, so a retry "
        "resumes after them, but if no retry comes their side effects stand alone",
        "retry with the same key, or compensate the finished steps",
    ),
    "cancelled": (
        "the work was cancelled part way (an asyncio task cancelled inside aguard, an ASGI "
        "app cancelled before its response started, an on_event hook interrupted on "
        "takeover): it may have done part of its work or "
        "all of it, so the key was kept, and a retry after the lease takes it over",
        "check what the cancelled work did before the retry runs it again",
    ),
    "takeover": (
        "a claim whose lease lapsed (a crash, a stall) was taken over: the previous executor "
        "may have done part of the work, or all of it",
        "check what the previous executor did (its finished steps, listed, are resumed)",
    ),
}

#: What to do once the record moved on, by (kind, the record's state now): the stream says
#: what was true when the entry was written, the record what is true now. A pair not here
#: keeps the entry's own action.
SINCE: Final[dict[tuple[str, str], str]] = {
    ("released_with_steps", "complete"): "nothing: a retry with the same key has since resumed "
    "after the finished steps and completed the operation",
    ("released_with_steps", "in_progress"): "wait: a retry with the same key is running now, "
    "resuming after the finished steps",
    ("completion_failed", "complete"): "check the side effect did not happen twice: a retry has "
    "since run the work again and completed the record",
}


def action_now(kind: str, state: str | None) -> str:
    """What to do about an entry of ``kind`` whose record is in ``state`` now (None: gone,
    expired or forgotten: the entry's own action, as nothing settled it)."""
    default = MEANINGS.get(kind, ("", ""))[1]
    return default if state is None else SINCE.get((kind, state), default)


#: How many entries a stream keeps, about (MAXLEN ~ trims whole nodes, cheaply).
MAX_ENTRIES: Final = 10_000
#: How many entries a store holds not yet written (waiting, being written or tried again), at
#: most, for either store: more are dropped, never queued without bound behind a slow Redis.
MAX_PENDING: Final = 64
#: How long an entry whose connection could not be made is tried again (Redis restarting).
RETRY_SECONDS: Final = 10.0


def uncertain_stream(prefix: str) -> str:
    """The stream of the uncertain outcomes under ``prefix``."""
    return f"{prefix}:uncertain"


def entry_fields(
    kind: UncertainKind,
    digest: str,
    scope: str,
    method: str,
    route: str,
    fence: int | None,
    detail: str,
    steps: tuple[str, ...],
) -> dict[str, str]:
    """The stream fields of one entry; ``at``: when it happened, in Unix ms (the stream id is
    when it was written, later by the writer's delay).

    Text only, as a record's origin keeps it (``idemkey._core.record_origin``): a lone
    surrogate in the scope, route, method or detail (text made from undecodable bytes, which
    the record's name accepts) is written escaped (``\\udcff``), since the client encodes
    the fields as strict UTF-8 and the entry would otherwise be lost in the writer."""
    return {
        "kind": kind,
        "at": str(int(time.time() * 1000)),
        "record": digest,
        "method": _text_only(method),
        "route": _text_only(route),
        "scope": _text_only(scope),
        "fence": "" if fence is None else str(fence),
        # A JSON list: a step name may hold a comma ("charge, then ship"). Step names are
        # printable (idemkey.guard._steps), so never a lone surrogate.
        "steps": _text_only(json.dumps(list(steps), ensure_ascii=False)) if steps else "",
        "detail": _text_only(detail[:500]),
    }


def _text_only(value: str) -> str:
    """``value`` with each lone surrogate as its backslash escape, as record_origin keeps it."""
    if value.isascii():
        return value
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True, slots=True)
class UncertainEntry:
    """One uncertain outcome: ``kind`` (see :data:`MEANINGS`), when (``at``, Unix seconds),
    the record's ``digest`` (``idemkey inspect --digest``), where it came from, the claim's
    ``fence``, the finished ``steps`` and the error or reason in ``detail``."""

    id: str
    kind: str
    at: float
    digest: str
    method: str = ""
    route: str = ""
    scope: str = ""
    fence: int | None = None
    steps: tuple[str, ...] = ()
    detail: str = ""

    @property
    def meaning(self) -> str:
        return MEANINGS.get(self.kind, ("", ""))[0]

    @property
    def action(self) -> str:
        return MEANINGS.get(self.kind, ("", ""))[1]


def decode_entry(entry_id: bytes | str, fields: Mapping[bytes, bytes]) -> UncertainEntry:
    """An entry read back with XRANGE or XREVRANGE."""
    get = {text(k): text(v) for k, v in fields.items()}.get
    name = text(entry_id)
    millis = stored_int(get("at", "") or name.partition("-")[0])
    steps = get("steps", "")
    return UncertainEntry(
        id=name,
        kind=get("kind", ""),
        at=millis / 1000 if millis is not None else 0.0,
        digest=get("record", ""),
        method=get("method", ""),
        route=get("route", ""),
        scope=get("scope", ""),
        fence=stored_int(get("fence", "")),
        steps=_steps(steps),
        detail=get("detail", ""),
    )


def _steps(stored: str) -> tuple[str, ...]:
    """The step names of an entry: a JSON list, or, written by 0.3.0 and earlier, joined with
    commas (read so until 0.5)."""
    if not stored:
        return ()
    if stored.startswith("["):
        try:
            names = json.loads(stored)
        except (ValueError, RecursionError):  # nested past the parser's depth: not ours
            names = None
        if isinstance(names, list) and all(isinstance(name, str) for name in names):
            # A foreign writer's "\\ud800" decodes to a lone surrogate, which no UTF-8 encodes
            # (the console's JSON and HTML would fail on it): escaped, as _text_only writes.
            return tuple(map(_text_only, names))
    return tuple(stored.split(","))
