"""The client's retry decisions, without I/O: which outcome retries, how long to wait, when to stop.

One :class:`Schedule` drives one logical call (one idempotency key). The I/O shells
(:mod:`idemkey.client._sync`, :mod:`idemkey.client._async`) only send bytes, read the clock and
sleep; every rule lives here and is tested without a network (``tests/client/test_retry.py``)::

    schedule = Schedule(policy, now=monotonic())
    while True:
        budget = schedule.send(monotonic())        # seconds left before the deadline
        ... send the same bytes with the same key, at most `budget` seconds ...
        step = schedule.answered(status, headers, body, monotonic(), time())
          or   schedule.failed("timeout", monotonic())
        Done -> return the response;  Refused -> raise;  GiveUp -> raise
        Retry -> sleep(step.delay) and go round again

States: ``ready`` (may send) -> ``sending`` (awaits the outcome) -> ``ready`` again after a
:class:`Retry`, or ``finished`` after :class:`Done`, :class:`Refused` or :class:`GiveUp`. Any
other order raises :class:`~idemkey.client.ClientStateError`, as h11 raises on an out-of-order
event: a shell that sends twice without reading the outcome is a bug, not a retry.

What retries (every retry sends the same key, so the server runs the handler at most once):

* a connection error, a timeout, a dropped or malformed response: the server may or may not
  have run the handler; only a retry with the same key can find out;
* ``409`` whose problem ``code`` is ``in_flight``: the first attempt still runs;
* a status in :attr:`RetryPolicy.retry_statuses` (429, 502, 503, 504 by default).

A ``Retry-After`` (delta-seconds or HTTP-date) is a floor on the wait. Nothing else retries:
a 422 ``key_reused`` or a 400 would fail the same way again.

The schedule also records whether an attempt of the call was *lost*: it may have reached the
handler, and its answer never came back (a timeout, a failure after connecting, a gateway's
502 or 504). Only then can a replay be the call's own answer (``Done.after_lost``); a refused
connection sent nothing, and ``409 in_flight`` (another call holds the key), idemkey's other
problems, 408, 425, 429 and 503 answer before the handler.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timezone
from email.utils import parsedate_to_datetime
from typing import Any, Final, Literal

from .._arguments import check_arguments
from ._errors import ClientStateError, shown
from ._options import count, fraction, invalid, seconds, status_codes

__all__ = [
    "PROBLEM_TYPE_PREFIX",
    "Done",
    "GiveUp",
    "Refused",
    "Retry",
    "RetryPolicy",
    "Schedule",
    "Step",
    "parse_retry_after",
    "read_problem",
]

#: Problem documents idemkey's server side answers with (``urn:idemkey:problem:key_reused``).
PROBLEM_TYPE_PREFIX: Final = "urn:idemkey:problem:"

#: The most digits of a delta-seconds ``Retry-After`` read as a number: more exceed a float
#: (1.8e308) and, past 4 300, what ``int()`` converts.
_RETRY_AFTER_DIGITS: Final = 308

#: Why an attempt got no response. Every kind retries: with the key, a retry is always safe.
FailureKind = Literal["connect", "timeout", "network", "protocol"]

#: The failures after which the request may have reached the handler: all but a connection
#: that was never made.
_MAY_HAVE_ARRIVED: Final = frozenset({"timeout", "network", "protocol"})

#: Retry statuses that say the request was not processed (RFC 9110 and 6585: 408 it was not
#: read in time, 425 not processed early, 429 rate-limited, 503 not handled now); idemkey's
#: server also releases the key after a 5xx and a 408 or 429. A 502 or a 504 is a gateway's,
#: which may have passed the request on to a handler that ran.
_NOT_PROCESSED: Final = frozenset({408, 425, 429, 503})

#: A problem code as idemkey's server writes them (``in_flight``, ``key_reused``): shown as it
#: is. Any other goes into log lines and messages as its repr, cut as short (``shown``).
_CODE: Final = re.compile(r"[a-z][a-z0-9_]{0,63}")
_CODE_CHARS: Final = 64


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a client retries one logical call. Immutable; share one across clients.

    ``deadline``: seconds from the first attempt after which no new attempt starts (and every
    attempt's timeouts are clipped to what is left). ``max_attempts`` counts the first one.
    The wait before retry *n* (1-based) is ``min(backoff_cap, backoff * 2 ** (n - 1))``, of
    which a random part up to ``jitter`` (a fraction) is taken off so that clients that failed
    together do not retry together; a ``Retry-After`` raises the wait to at least its value.
    """

    max_attempts: int = 8
    deadline: float = 60.0
    backoff: float = 0.25
    backoff_cap: float = 8.0
    jitter: float = 0.5
    retry_statuses: frozenset[int] = frozenset({429, 502, 503, 504})

    def __new__(cls, *args: Any, **options: Any) -> RetryPolicy:
        # An unknown or repeated option is a ConfigurationError naming it, not the TypeError
        # of the generated __init__.
        check_arguments(cls, args, options)
        return object.__new__(cls)

    def __post_init__(self) -> None:
        where = "RetryPolicy"
        backoff = seconds(where, "backoff", self.backoff)
        cap = seconds(where, "backoff_cap", self.backoff_cap)
        if cap < backoff:
            raise invalid(where, "backoff_cap", f"seconds >= backoff ({backoff:g})", cap)
        statuses = status_codes(where, "retry_statuses", self.retry_statuses)
        # A 4xx outcome (422 key_reused, 400, 402...) fails the same way every time.
        if never := sorted(s for s in statuses if 400 <= s < 500 and s not in (408, 425, 429)):
            raise invalid(where, "retry_statuses", "no 4xx but 408, 425 and 429", never)
        for name, value in (
            ("max_attempts", count(where, "max_attempts", self.max_attempts, least=1)),
            ("deadline", seconds(where, "deadline", self.deadline, positive=True)),
            ("backoff", backoff),
            ("backoff_cap", cap),
            ("jitter", fraction(where, "jitter", self.jitter)),
            ("retry_statuses", statuses),
        ):
            object.__setattr__(self, name, value)  # frozen: set once, here, converted

    def backoff_for(self, retry: int, draw: float) -> float:
        """The wait before retry number ``retry`` (1-based), ``draw`` in [0, 1) for the jitter."""
        doublings = retry - 1
        if self.backoff == 0.0:
            ceiling = 0.0
        # The cap first: past the doublings that reach it (fewer than 2 100, a float's whole
        # range) the wait is the cap, where 2.0 ** 1024 would raise OverflowError.
        elif doublings < math.log2(self.backoff_cap) - math.log2(self.backoff):
            ceiling = min(self.backoff_cap, math.ldexp(self.backoff, doublings))
        else:
            ceiling = self.backoff_cap
        return ceiling * (1.0 - self.jitter * draw)


# ---- steps ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Done:
    """The response is the call's answer (a replay or not): hand it to the caller.

    ``after_lost``: an earlier attempt of the call was lost (it may have reached the handler),
    so a replay may be its answer; else a replay answers another call that used the key.
    """

    after_lost: bool = False


@dataclass(frozen=True, slots=True)
class Refused:
    """The server refused the call with an idemkey problem document: raise, never retry."""

    code: str
    problem: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class Retry:
    """Wait ``delay`` seconds, then send the same bytes with the same key again."""

    delay: float
    reason: str
    attempt: int  # the attempt that just failed, 1-based
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Stop: the deadline or the attempt budget is spent; ``reason`` says which, ``last`` why.

    ``retry_after``: the server's ``Retry-After`` when that wait is what ends the call, longer
    than the ``left`` seconds before the deadline (else both None).
    """

    reason: Literal["deadline", "attempts"]
    last: str
    attempts: int
    retry_after: float | None = None
    left: float | None = None


Step = Done | Refused | Retry | GiveUp


# ---- parsing -------------------------------------------------------------------------------


def parse_retry_after(value: str | None, wall_now: float) -> float | None:
    """``Retry-After`` in seconds from now (RFC 9110 10.2.3), or None when absent or unreadable.

    Delta-seconds (``"2"``) or an HTTP-date in any of its three forms (an asctime date, which
    names no zone, is GMT as every HTTP-date), read against ``wall_now`` (Unix time); a date in
    the past means "now" (0.0). Delta-seconds of any length are a wait: more digits than a
    float holds are ``math.inf``, longer than any deadline (the schedule gives up at once, as
    for ``"99999999999999999999"``). What is neither (``"1e9"``, ``"-1"``, a date with a year
    no ``datetime`` holds, such as ``10000`` or twenty digits) is unreadable: None.
    """
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        digits = value.lstrip("0") or "0"
        return float(int(digits)) if len(digits) <= _RETRY_AFTER_DIGITS else math.inf
    try:
        when = parsedate_to_datetime(value)
        # OverflowError: a year past a C long (a year past 9999 is a ValueError).
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an asctime date (or "-0000") is naive; every HTTP-date is GMT
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - wall_now)


def read_problem(headers: Mapping[str, str], body: bytes) -> Mapping[str, object] | None:
    """The RFC 9457 problem document in ``body``, or None when it is not one."""
    content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type not in ("application/problem+json", "application/json"):
        return None
    try:
        document = json.loads(body)
    # UnicodeDecodeError is a ValueError too; RecursionError: arrays or objects nested deeper
    # than the interpreter's recursion limit (`[` * 100 000), not a problem document either.
    except (ValueError, RecursionError):
        return None
    return document if isinstance(document, dict) else None


def _idemkey_code(problem: Mapping[str, object] | None) -> str | None:
    """The problem's code, if idemkey's; one that is no short token as its repr, cut short.

    The code goes into the retry log line, ``RetryEvent.reason`` and the errors' messages: a
    server's newline in it would forge a log line, a megabyte of it a megabyte line per retry.
    """
    if problem is None:
        return None
    kind, code = problem.get("type"), problem.get("code")
    if isinstance(kind, str) and kind.startswith(PROBLEM_TYPE_PREFIX) and isinstance(code, str):
        return shown(code, _CODE_CHARS, _CODE.fullmatch)
    return None


# ---- the schedule --------------------------------------------------------------------------


@dataclass(slots=True)
class Schedule:
    """The retry state of one logical call; see the module docstring for the protocol.

    ``now`` values are monotonic seconds, ``wall_now`` is Unix time (for HTTP-dates only).
    ``draw`` returns a number in [0, 1) for the jitter (inject a constant in tests).
    """

    policy: RetryPolicy
    now: float
    draw: Callable[[], float] = field(default=random.random)
    attempts: int = 0
    state: Literal["ready", "sending", "finished"] = "ready"
    #: An attempt was lost: it may have reached the handler, its answer never came back.
    lost: bool = False
    started: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.now

    @property
    def deadline_at(self) -> float:
        return self.started + self.policy.deadline

    def send(self, now: float) -> float:
        """Start an attempt; returns the seconds it may take (what is left before the deadline)."""
        if self.state != "ready":
            raise ClientStateError(f"cannot start an attempt while {self.state}")
        self.state = "sending"
        self.attempts += 1
        return max(0.0, self.deadline_at - now)

    def answered(
        self, status: int, headers: Mapping[str, str], body: bytes, now: float, wall_now: float
    ) -> Step:
        """The server answered the attempt: accept, refuse, or retry."""
        self._expect_sending("an answer")
        if status in self.policy.retry_statuses or status == 409:
            problem = read_problem(headers, body)
            code = _idemkey_code(problem)
            if status != 409 or code == "in_flight":
                # idemkey's problems (in_flight, store_unavailable...) answer before the handler.
                if code is None and status not in _NOT_PROCESSED:
                    self.lost = True
                retry_after = parse_retry_after(headers.get("retry-after"), wall_now)
                reason = f"{status} {code}" if code else str(status)
                return self._retry(reason, now, retry_after)
            if code is not None and problem is not None:
                return self._finish(Refused(code, problem))
            return self._finish(Done(self.lost))
        if 400 <= status < 500:
            problem = read_problem(headers, body)
            code = _idemkey_code(problem)
            if code is not None and problem is not None:
                return self._finish(Refused(code, problem))
        return self._finish(Done(self.lost))

    def failed(self, kind: FailureKind, now: float) -> Step:
        """The attempt got no (complete) response: retry with the same key, if time allows."""
        self._expect_sending("a failure")
        if kind in _MAY_HAVE_ARRIVED:
            self.lost = True
        return self._retry(kind, now, None)

    def _retry(self, reason: str, now: float, retry_after: float | None) -> Step:
        if now >= self.deadline_at:  # an attempt the deadline cut off, whatever the count
            return self._finish(GiveUp("deadline", reason, self.attempts))
        if self.attempts >= self.policy.max_attempts:
            return self._finish(GiveUp("attempts", reason, self.attempts))
        delay = self.policy.backoff_for(self.attempts, self.draw())
        if retry_after is not None:
            delay = max(delay, retry_after)
        # Starting an attempt we know cannot finish in time only doubles the load.
        if now + delay >= self.deadline_at:
            if retry_after is not None and retry_after >= delay:  # the server's wait, not ours
                left = self.deadline_at - now
                return self._finish(GiveUp("deadline", reason, self.attempts, retry_after, left))
            return self._finish(GiveUp("deadline", reason, self.attempts))
        self.state = "ready"
        return Retry(delay, reason, self.attempts, retry_after)

    def _finish(self, step: Step) -> Step:
        self.state = "finished"
        return step

    def _expect_sending(self, what: str) -> None:
        if self.state != "sending":
            raise ClientStateError(f"got {what} while {self.state}, not sending")
