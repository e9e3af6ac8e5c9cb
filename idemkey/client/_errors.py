"""The client's exceptions, under :class:`~idemkey.errors.IdemkeyError`.

::

    IdemkeyError
    └── ClientError                 root of everything idemkey.client raises
        ├── RefusedError            the server refused with an idemkey problem document
        ├── RetriesExhaustedError   the deadline or the attempt budget ran out
        ├── UnusableAnswerError     an answer httpx raised on (a body that fails to decode...)
        ├── UnexpectedReplayError   a replay the caller refused (Client(on_replay=...))
        └── ClientStateError        a retry schedule was driven out of order (a bug)

Like the rest of idemkey, an error never carries the raw idempotency key in its message (keys
may be secrets); the caller holds it already (``Operation.key``), and an error that ends a
call whose answer may yet exist holds it as an attribute (``key``), for a ``post()`` whose
key the caller never saw.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from ..errors import IdemkeyError

if TYPE_CHECKING:
    import httpx

    from ._operation import IdempotentResponse

__all__ = [
    "ClientError",
    "ClientStateError",
    "RefusedError",
    "RetriesExhaustedError",
    "UnexpectedReplayError",
    "UnusableAnswerError",
]


class ClientError(IdemkeyError):
    """Root of every exception :mod:`idemkey.client` raises."""


#: The longest problem ``detail`` a message shows as it is.
_DETAIL_CHARS: Final = 200

_detail_repr = reprlib.Repr()
_detail_repr.maxstring = _DETAIL_CHARS // 2
_detail_repr.maxother = _DETAIL_CHARS // 2


def _shown_detail(value: object) -> str:
    """A server's ``detail`` as a message shows it: as it is if one short printable line,
    else its repr, cut short (a newline in it would forge a log line where it is logged)."""
    if isinstance(value, str) and value.isprintable() and len(value) <= _DETAIL_CHARS:
        return value
    return _detail_repr.repr(value)


class RefusedError(ClientError):
    """The server refused the call: ``code`` is the problem's stable code (``key_reused``).

    ``problem`` is the whole RFC 9457 document, ``status`` the HTTP status and ``response``
    the ``httpx.Response`` itself. Retrying with the same key and body fails the same way.
    """

    def __init__(
        self, code: str, problem: Mapping[str, object], response: httpx.Response, attempts: int
    ) -> None:
        detail = _shown_detail(problem.get("detail") or problem.get("title") or "")
        super().__init__(f"{response.status_code} {code}: {detail}")
        self.code = code
        self.problem = problem
        self.status = response.status_code
        self.response = response
        self.attempts = attempts

    @property
    def retry(self) -> str | None:
        """The problem's ``retry`` member (``"same_key"``, ``"new_key"``, ``"never"``), when
        the server sent one."""
        value = self.problem.get("retry")
        return value if isinstance(value, str) else None


class UnexpectedReplayError(ClientError):
    """The server answered with a replay (``Idempotent-Replayed: true``) the caller did not
    expect (``Client(on_replay="refuse")``: no earlier attempt of the call may have reached
    the handler): the operation was not run for this call, so whatever it hands out (a
    resource, a credit) was handed out before. ``reply`` is the
    :class:`~idemkey.client.IdempotentResponse`, ``key`` its key.
    """

    def __init__(self, reply: IdempotentResponse) -> None:
        super().__init__(
            f"{reply.status_code} replayed on attempt {reply.attempts}: this key's operation "
            "ran before this call, nothing ran now"
        )
        self.reply = reply
        self.key = reply.key
        self.attempts = reply.attempts


class RetriesExhaustedError(ClientError):
    """No attempt got an answer worth returning before the deadline or the attempt budget.

    ``reason`` is ``"deadline"`` or ``"attempts"``; ``last`` describes the last failure
    (``"timeout"``, ``"503"``, ``"409 in_flight"``); ``response`` is the last response when
    the last attempt got one (else None, and the transport error is ``__cause__``). The
    handler ran at most once: send the same key again later to learn its answer. ``key`` is
    that key (a ``post()`` made it where the caller never saw it): ``idempotency_key=key``
    resumes the call, where a plain ``post()`` would send a new key and run it again.
    """

    def __init__(
        self,
        reason: str,
        last: str,
        attempts: int,
        response: httpx.Response | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__(f"gave up after {attempts} attempt(s) ({reason}); last: {last}")
        self.reason = reason
        self.last = last
        self.attempts = attempts
        self.response = response
        self.key = key


class UnusableAnswerError(ClientError):
    """The server answered, and httpx raised on the answer rather than return it: a body that
    fails to decode (``httpx.DecodingError``), a redirect whose ``Location`` is no URL, more
    redirects than ``max_redirects`` (``httpx.TooManyRedirects``), a response event hook that
    raised an httpx error. The httpx error is ``__cause__``.

    Never retried: the same answer would come again. The server got the request, so its handler
    may have run: ``key`` is the key it got and ``attempts`` how many were sent;
    ``idempotency_key=key`` resumes the call, where a plain ``post()`` would run it again.
    """

    def __init__(self, key: str, attempts: int) -> None:
        super().__init__(
            f"attempt {attempts} was answered, but httpx raised on the answer (see the cause)"
        )
        self.key = key
        self.attempts = attempts


class ClientStateError(ClientError, RuntimeError):
    """A retry :class:`~idemkey.client.Schedule` was driven out of order."""
