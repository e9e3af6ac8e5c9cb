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

import contextlib
import dataclasses
import reprlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar

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
    "shown",
]

_T = TypeVar("_T")


def shown(value: object, limit: int, plain: Callable[[str], object] = str.isprintable) -> str:
    """A server's ``value`` (a problem's detail or code, a URL it redirected to) as a message or
    a log line shows it: as it is when a string of at most ``limit`` characters that ``plain``
    accepts (one printable line), else its repr cut to ``limit`` characters.

    The repr escapes every character ``str.isprintable`` refuses: a newline would forge a log
    line where the text is logged, an escape sequence or a bidirectional override would rewrite
    a terminal's. Cut, it is short whatever the value: a megabyte string, a JSON array nested
    deep (whose plain ``reprlib`` repr ran to megabytes)."""
    if isinstance(value, str) and len(value) <= limit and plain(value):
        return value
    cut = reprlib.Repr()  # one per call: a shared one's limits would be set across threads
    cut.maxlevel = 3
    cut.maxstring = cut.maxother = cut.maxlong = limit
    text = cut.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ClientError(IdemkeyError):
    """Root of every exception :mod:`idemkey.client` raises.

    Like every idemkey error, each keeps its constructor's arguments as ``args``: pickle (how a
    Celery worker hands a task's error to its caller, and stores it with a pickle result
    backend) and ``copy`` rebuild it, same type, message and attributes. An ``httpx.Response``
    in one (``response``, ``reply.response``) crosses as a plain copy, whatever it holds (with
    ``Client(default_encoding=<a lambda>)`` no response pickles: httpx sets it on each): its
    status, headers, body (as read, decoded; not read if it was not), text encoding and
    ``elapsed``, and its request's method, URL and headers without the caller's credentials
    (no ``Authorization``, ``Proxy-Authorization`` or ``Cookie``, no ``user:password`` and no
    query string, which may carry a token); no ``history``, ``next_request`` or extensions.

    Celery's JSON results (its default) store ``args`` too, each value JSON cannot encode as its
    repr, and the caller's ``result.get()`` raises ``type(exc)(*args)``: so the plain values a
    caller reads (``status``, ``key``, ``attempts``...) are in ``args`` as well, and an error
    given the repr (a ``str``) or None in place of its response (``reply``) has the same type,
    message and fields, its ``response`` (``reply``) None.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        # BaseException's (type, args, __dict__), each response as a plain copy: one per
        # response, the same in args and in the attribute, as they were one object.
        copies: dict[int, object] = {}

        def portable(value: object) -> object:
            if id(value) not in copies:
                copies[id(value)] = _portable(value)
            return copies[id(value)]

        args = tuple(portable(value) for value in self.args)
        return type(self), args, {name: portable(value) for name, value in vars(self).items()}


#: Request headers that carry the caller's credentials: they do not cross with an error.
_CREDENTIALS: Final = frozenset({b"authorization", b"proxy-authorization", b"cookie"})


def _portable(value: object) -> object:
    """``value``, or a copy of it whose ``httpx.Response`` is :func:`_plain`."""
    import httpx

    from ._operation import IdempotentResponse

    if isinstance(value, IdempotentResponse):
        return dataclasses.replace(value, response=_plain(value.response))
    return _plain(value) if isinstance(value, httpx.Response) else value


def _plain(response: httpx.Response) -> httpx.Response:
    """A new ``httpx.Response`` that pickles, with what a caller reads of ``response``."""
    import httpx

    try:
        sent = response.request
    except RuntimeError:  # a response built without its request
        request = None
    else:
        kept = [
            (name, value) for name, value in sent.headers.raw if name.lower() not in _CREDENTIALS
        ]
        # The URL without user:password or its query (``?api_key=...``), as every log line has it.
        url = sent.url.copy_with(userinfo=b"", query=None)
        request = httpx.Request(sent.method, url, headers=kept)
    status, headers = response.status_code, response.headers
    try:
        content = response.content
    except httpx.ResponseNotRead:  # unread on the other side too, as httpx pickles it
        return httpx.Response(status, headers=headers, stream=response.stream, request=request)
    # The body is decoded already: without Content-Encoding, else httpx would decode it again.
    raw = [(name, value) for name, value in headers.raw if name.lower() != b"content-encoding"]
    plain = httpx.Response(
        status,
        headers=raw,
        content=content,
        request=request,
        default_encoding=response.encoding or "utf-8",
    )
    plain.headers = headers.copy()  # as they came
    if response.encoding is not None:  # the caller's override of the charset too
        plain.encoding = response.encoding
    with contextlib.suppress(RuntimeError):  # not closed yet: no elapsed time
        plain.elapsed = response.elapsed
    return plain


def _unless_repr(value: _T | str | None) -> _T | None:
    """``value``, or None for the ``str`` Celery's JSON results hold in place of a response (a
    reply) they cannot encode: its repr."""
    return None if isinstance(value, str) else value


#: The longest problem ``detail`` (or ``title``) a message shows.
_DETAIL_CHARS: Final = 200


class RefusedError(ClientError):
    """The server refused the call: ``code`` is the problem's stable code (``key_reused``).

    ``problem`` is the whole RFC 9457 document, ``status`` the HTTP status and ``response``
    the ``httpx.Response`` itself (pickled or copied, a plain copy of it: see
    :class:`ClientError`). The message shows the problem's ``detail`` (or ``title``) as it is
    when one short printable line, else escaped and cut short. Retrying with the same key and
    body fails the same way.

    ``status`` is the response's; without a response (None, or the ``str`` Celery's JSON
    results hold in its place: see :class:`ClientError`) it must be given, and ``response``
    is None.
    """

    def __init__(
        self,
        code: str,
        problem: Mapping[str, object],
        response: httpx.Response | None,
        attempts: int,
        status: int | None = None,
    ) -> None:
        response = _unless_repr(response)
        if response is not None:
            status = response.status_code
        elif status is None:
            raise TypeError("RefusedError without a response needs its status")
        detail = shown(problem.get("detail") or problem.get("title") or "", _DETAIL_CHARS)
        super().__init__(f"{status} {code}: {detail}")
        self._keep_args(code, problem, response, attempts, status)
        self.code = code
        self.problem = problem
        self.status = status
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
    :class:`~idemkey.client.IdempotentResponse` (pickled or copied, with a plain copy of its
    response: see :class:`ClientError`).

    ``key``, ``attempts`` and ``status`` are the reply's key, attempt count and HTTP status;
    without a reply (None, or the ``str`` Celery's JSON results hold in its place: see
    :class:`ClientError`) they must be given, and ``reply`` is None.
    """

    def __init__(
        self,
        reply: IdempotentResponse | None,
        key: str | None = None,
        attempts: int | None = None,
        status: int | None = None,
    ) -> None:
        reply = _unless_repr(reply)
        if reply is not None:
            key, attempts, status = reply.key, reply.attempts, reply.status_code
        elif key is None or attempts is None or status is None:
            raise TypeError("UnexpectedReplayError without a reply needs key, attempts, status")
        super().__init__(
            f"{status} replayed on attempt {attempts}: this key's operation "
            "ran before this call, nothing ran now"
        )
        self._keep_args(reply, key, attempts, status)
        self.reply = reply
        self.key = key
        self.attempts = attempts
        self.status = status


class RetriesExhaustedError(ClientError):
    """No attempt got an answer worth returning before the deadline or the attempt budget.

    ``reason`` is ``"deadline"`` or ``"attempts"``; ``last`` describes the last failure
    (``"timeout"``, ``"503"``, ``"409 in_flight"``); ``response`` is the last response when
    the last attempt got one (else None, and the transport error is ``__cause__``; pickled or
    copied, a plain copy of it; None through Celery's JSON results: see :class:`ClientError`).
    The handler ran at most once: send the same key again later to learn its answer. ``key``
    is that key (a ``post()`` made it where the caller never saw it): ``idempotency_key=key``
    resumes the call, where a plain ``post()`` would send a new key and run it again.

    ``retry_after`` is the server's ``Retry-After`` in seconds when that wait ended the call,
    longer than the ``left`` seconds before the deadline (``reason`` ``"deadline"``, and the
    message says so); else both are None. ``reason`` ``"unretryable"``: an attempt after the
    first raised an httpx error no retry can help (``last`` names it; it is ``__cause__``),
    and an earlier attempt may have reached the handler.
    """

    def __init__(
        self,
        reason: str,
        last: str,
        attempts: int,
        response: httpx.Response | None = None,
        key: str | None = None,
        retry_after: float | None = None,
        left: float | None = None,
    ) -> None:
        message = f"gave up after {attempts} attempt(s) ({reason}); last: {last}"
        if retry_after is not None and left is not None:
            message += (
                f"; the server asked to wait {_seconds(retry_after)} s, past the "
                f"{_seconds(left)} s left"
            )
        super().__init__(message)
        response = _unless_repr(response)
        self._keep_args(reason, last, attempts, response, key, retry_after, left)
        self.reason = reason
        self.last = last
        self.attempts = attempts
        self.response = response
        self.key = key
        self.retry_after = retry_after
        self.left = left


def _seconds(value: float) -> str:
    """Seconds as a message shows them: ``4.9``, ``120``, ``2.5e+11``."""
    return f"{value:.2g}" if value < 10 else f"{value:.0f}" if value < 1e6 else f"{value:.3g}"


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
        self._keep_args(key, attempts)
        self.key = key
        self.attempts = attempts


class ClientStateError(ClientError, RuntimeError):
    """A retry :class:`~idemkey.client.Schedule` was driven out of order."""
