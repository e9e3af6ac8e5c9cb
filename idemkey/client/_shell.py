"""What the sync and async shells share: building operations, and acting on a retry step.

The shells (``_sync.py``, ``_async.py``) differ only in ``await`` and in how they sleep; each
decision they act on comes from :class:`~idemkey.client._retry.Schedule`, and each action on a
decision (return, raise, report and wait) is :func:`settle`, here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Final, Literal

import httpx

from ._errors import RefusedError, RetriesExhaustedError, UnexpectedReplayError, shown
from ._operation import DEFAULT_HEADER, IdempotentResponse, Operation, RetryEvent, RetryHook
from ._options import check_hook, http_timeout, invalid
from ._retry import Done, FailureKind, GiveUp, Refused, Retry, RetryPolicy, Step

__all__ = [
    "DEFAULT_RETRY",
    "Preparing",
    "ReplayCheck",
    "check_replay",
    "failure_kind",
    "logger",
    "redirect_to_follow",
    "replay_check",
    "replayable",
    "settle",
    "unretried",
    "unusable_answer",
]

logger = logging.getLogger("idemkey.client")

DEFAULT_RETRY = RetryPolicy()

#: The longest URL of the server's a log line shows (a redirect's).
_URL_CHARS: Final = 200


class Preparing:
    """``prepare()``, the same for :class:`Client` and :class:`AsyncClient` (it does no I/O)."""

    http: httpx.Client | httpx.AsyncClient
    header: str = DEFAULT_HEADER

    def prepare(
        self,
        method: str,
        url: httpx.URL | str,
        *,
        content: Any = None,
        data: Any = None,
        files: Any = None,
        json: Any = None,
        params: Any = None,
        headers: Any = None,
        timeout: Any = httpx.USE_CLIENT_DEFAULT,
        idempotency_key: str | None = None,
    ) -> Operation:
        """Build and serialise the request once, and fix its key; nothing is sent yet.

        The key is ``idempotency_key`` if given (say, derived from a job id, or persisted from
        an earlier run; bare, or in RFC 8941 quotes, and sent as given), else a random UUID.
        Persist ``operation.key`` before :meth:`send` if a process restart must resume the same
        call rather than start a new one.
        """
        http_timeout(f"{type(self).__name__}.prepare", "timeout", timeout)
        request = self.http.build_request(
            method, url, content=content, data=data, files=files, json=json,
            params=params, headers=headers, timeout=timeout,
        )  # fmt: skip
        return Operation.from_request(request, self.header, idempotency_key)


def redirect_to_follow(
    http: httpx.Client | httpx.AsyncClient, origin: httpx.URL, response: httpx.Response
) -> httpx.Request | None:
    """The redirect an attempt follows from ``response``, or None: ``response`` is its answer.

    A redirect is followed as the httpx client says (``follow_redirects``), but only within
    ``origin``, the call's: httpx follows one anywhere with every header but Authorization and
    Cookie (and on 307 and 308 with the body), so the key, possibly a secret, and the write
    itself would reach another server, one that shares no record with this one. A redirect to
    another origin is the call's answer, as httpx returns it with ``follow_redirects=False``
    (its ``next_request`` built, not sent).
    """
    after = response.next_request
    if after is None or not http.follow_redirects:
        return None
    if _origin(after.url) != _origin(origin):
        # The URLs without their query (it may carry tokens) or user:password, never the key;
        # cut short: the server chose them (httpx escapes them, but a path or host may be long).
        url = response.request.url.copy_with(query=None, userinfo=b"")
        elsewhere = after.url.copy_with(path="/", query=None, fragment=None, userinfo=b"")
        logger.warning(
            "%s %s answered %d to another origin (%s): not followed, a keyed call stays on "
            "its origin",
            response.request.method, shown(str(url), _URL_CHARS), response.status_code,
            shown(str(elsewhere), _URL_CHARS),
        )  # fmt: skip
        return None
    return after


def replayable(request: httpx.Request) -> bool:
    """Whether a transport can key and retry ``request``: not when its body is an async stream
    (an upload from an async generator), which can be sent once only. Such a request is sent
    as it is, with no key added and no retry (a warning says so): refusing it, as
    ``Client.prepare`` does, broke every streaming upload of an app that mounted the transport.
    """
    if isinstance(request.stream, Iterable):
        return True
    logger.warning(
        "%s %s: the body is an async stream, which cannot be sent twice: sent once, as it is, "
        "without an added key or retries",
        request.method, request.url.copy_with(query=None, userinfo=b""),
    )  # fmt: skip
    return False


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    """RFC 6454's origin of ``url``: scheme, host and port (the scheme's own when not given)."""
    return url.scheme, url.host, url.port or {"http": 80, "https": 443}.get(url.scheme)


def failure_kind(exc: httpx.HTTPError) -> FailureKind | None:
    """Which retryable failure ``exc`` is, or None when a retry cannot help (a bad URL, say,
    or an :func:`unusable_answer`)."""
    if unusable_answer(exc):
        return None
    # A ProxyError is a proxy refusing the tunnel (CONNECT answered 502, say, or a SOCKS
    # failure): the request never left for the origin.
    connect = httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout | httpx.ProxyError
    if isinstance(exc, connect):
        return "connect"  # nothing was sent
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.NetworkError):
        return "network"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "protocol"  # e.g. the connection closed before a response
    return None


def unusable_answer(exc: httpx.HTTPError) -> bool:
    """Whether ``exc`` is httpx raising on a complete answer: the server got the request and
    answered, and the same answer would come again (so a retry cannot help, and the call's key
    must reach the caller).

    Every httpx error but a transport's (a body that fails to decode, ``TooManyRedirects``, a
    response hook's ``raise_for_status()``), and the ``RemoteProtocolError`` httpx raises for a
    redirect whose ``Location`` is no URL: it builds ``next_request`` even with
    ``follow_redirects=False``, from the ``InvalidURL`` that stays its context. A protocol
    error from the connection itself has an httpcore error as its context, and is retried.
    """
    if isinstance(exc, httpx.RemoteProtocolError):
        return isinstance(exc.__context__, httpx.InvalidURL)
    return not isinstance(exc, httpx.TransportError)


def unretried(exc: httpx.HTTPError, operation: Operation, attempts: int) -> RetriesExhaustedError:
    """What ends a ``post()`` when attempt ``attempts`` (after the first) raised ``exc``, an
    httpx error no retry can help: an earlier attempt may have reached the handler, so the
    call ends with its key (``reason`` ``"unretryable"``), never with the bare httpx error."""
    return RetriesExhaustedError("unretryable", type(exc).__name__, attempts, None, operation.key)


def settle(
    step: Step,
    attempts: int,
    operation: Operation,
    response: httpx.Response | None,
    error: httpx.HTTPError | None,
    on_retry: RetryHook | None,
    *,
    transport: bool = False,
) -> IdempotentResponse | float:
    """Act on a :class:`Schedule` step: the answer, a raise, or the seconds to wait.

    A transport (``transport=True``) raises nothing of its own: a refusal is a response like
    any other, and giving up returns the last response or re-raises the last httpx error.
    """
    if isinstance(step, Retry):
        _report(
            on_retry, RetryEvent(operation, step.attempt, step.reason, step.delay, step.retry_after)
        )
        return step.delay
    if isinstance(step, Done) or (isinstance(step, Refused) and transport):
        assert response is not None
        lost = isinstance(step, Done) and step.after_lost
        return IdempotentResponse(response, operation.key, attempts, lost)
    if isinstance(step, Refused):
        assert response is not None
        raise RefusedError(step.code, step.problem, response, attempts)
    assert isinstance(step, GiveUp)
    if transport:  # hand httpx what it would have had without us: the response, or the error
        if response is not None:
            return IdempotentResponse(response, operation.key, attempts)
        assert error is not None
        raise error
    raise RetriesExhaustedError(
        step.reason, step.last, step.attempts, response, operation.key, step.retry_after,
        step.left,
    ) from error  # fmt: skip


#: What a client does with a replayed answer (``Client(on_replay=...)``): ``"accept"`` it (the
#: default), ``"refuse"`` one that no earlier attempt of the call explains (none was lost: none
#: may have reached the handler, so the key's operation was done before, by another call), or
#: call a function with every replayed answer, which refuses it by raising.
ReplayCheck = Literal["accept", "refuse"] | Callable[[IdempotentResponse], object]


def replay_check(where: str, value: ReplayCheck) -> ReplayCheck:
    if value in ("accept", "refuse"):
        return value
    if callable(value):
        # Called synchronously, an async function's coroutine never ran: no replay refused.
        return check_hook(where, "on_replay", value)
    raise invalid(where, "on_replay", "'accept', 'refuse' or a callable(response)", value)


def check_replay(check: ReplayCheck, reply: IdempotentResponse) -> IdempotentResponse:
    """``reply``, unless ``check`` refuses it (:class:`UnexpectedReplayError`)."""
    if check == "accept" or not reply.replayed:
        return reply
    if check == "refuse":
        # A replay is the call's own answer only after an attempt that may have reached the
        # handler; after a refused connection, 409 in_flight or a 503 it is another call's.
        if not reply.after_lost:
            raise UnexpectedReplayError(reply)
        return reply
    assert callable(check)
    check(reply)
    return reply


def _report(hook: RetryHook | None, event: RetryEvent) -> None:
    # The URL without its query (it may carry tokens), and never the key.
    url = event.operation.url.copy_with(query=None, userinfo=b"")  # tokens, a password
    logger.info(
        "retrying %s %s in %.2f s: attempt %d failed (%s)",
        event.operation.method, url, event.delay, event.attempt, event.reason,
    )  # fmt: skip
    if hook is None:
        return
    try:
        hook(event)
    except Exception:
        logger.exception("the on_retry hook raised; retrying anyway")
