"""The probe's I/O: HTTP/1.1 over :mod:`http.client`, one connection per request, threads for
the requests of a batch sent at once. Only the standard library: the probe runs wherever
idemkey is installed, against any server."""

from __future__ import annotations

import http.client
import io
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from ..readable import shown
from .answers import Answer, NoResponse, Response
from .session import Batch, Outgoing

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["MAX_BODY_BYTES", "Target", "Unreachable", "parse_target", "send_batch"]

#: Bodies longer than this are cut (the comparison sees their first 8 MiB, and says so).
MAX_BODY_BYTES: Final = 8 * 1024 * 1024


class Unreachable(Exception):
    """No connection could be made to the endpoint (refused, unknown host, TLS failure)."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where the requests go."""

    method: str
    scheme: str
    host: str
    port: int
    path: str  # with the query

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_target(method: str, url: str) -> Target:
    """The endpoint named by ``url`` (http or https); ValueError with the reason when bad.

    A URL with user information (``user:password@``) is refused, first, so that no message
    prints the password: http.client would not send it, and the probe would run
    unauthenticated without a word."""
    parts = urlsplit(url)
    if "@" in parts.netloc:
        user = parts.username or ""
        given = f"{user}:***@" if parts.password is not None else f"{user}@"
        raise ValueError(
            f"the probe does not send credentials written in the URL ({given}): pass them as "
            "-H 'Authorization: Basic <base64 of user:password>' and a URL without them"
        )
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"URL must start with http:// or https://, got {url!r}")
    if not parts.hostname:
        raise ValueError(f"URL has no host: {url!r}")
    port = parts.port  # raises ValueError for a port out of range
    if not all(33 <= ord(c) <= 126 for c in parts.path + parts.query):
        raise ValueError(f"percent-encode spaces and non-ASCII characters in the URL: {url!r}")
    default = 443 if parts.scheme == "https" else 80
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(method, parts.scheme, parts.hostname, port or default, path)


def _connect(target: Target, timeout: float) -> http.client.HTTPConnection:
    kind = http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
    connection = kind(target.host, target.port, timeout=timeout)
    try:
        connection.connect()
    except OSError as exc:  # refused, DNS, connect timeout, TLS handshake (ssl.SSLError)
        connection.close()
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise Unreachable(f"cannot connect to {target.address}: {reason}") from None
    return connection


class _UntilDeadline(io.RawIOBase):
    """An answer's bytes, each read given only the time left until ``deadline``. The socket's
    timeout bounds one read, not the answer: a server sending a byte every second would hold
    the probe for as long as it likes (8 MiB of body at that pace: three months)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer, /) -> int | None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the answer took longer than the request's deadline")
        self._sock.settimeout(left)
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


def _answer_class(deadline: float) -> type[http.client.HTTPResponse]:
    """An http.client response that reads its status line, head and body by ``deadline``."""

    class _Answer(http.client.HTTPResponse):
        def __init__(
            self,
            sock: socket.socket,
            debuglevel: int = 0,
            method: str | None = None,
            url: str | None = None,
        ) -> None:
            super().__init__(sock, debuglevel, method, url)
            plain, self.fp = self.fp, io.BufferedReader(_UntilDeadline(sock, deadline))
            plain.close()  # nothing read from it yet; the socket stays open for ours

    return _Answer


def _exchange(
    connection: http.client.HTTPConnection, target: Target, request: Outgoing, timeout: float
) -> Answer:
    sent_at = answered_at = 0.0
    # --timeout is a deadline for the whole request, from sending it to its body's last byte.
    connection.response_class = _answer_class(time.monotonic() + timeout)
    try:
        has_host = any(n.lower() == "host" for n, _ in request.headers)
        connection.putrequest(target.method, target.path, skip_host=has_host)
        for name, value in request.headers:
            connection.putheader(name, value)
        connection.putheader("Content-Length", str(len(request.body)))
        connection.endheaders(request.body)
        sent_at = time.monotonic()
        response = connection.getresponse()
        answered_at = time.monotonic()
        body = response.read(MAX_BODY_BYTES)
        # http.client's read(amt) ends quietly where the connection does: a body shorter than
        # its Content-Length would be compared as a whole one (and called another execution).
        left = response.length or 0
        if left and len(body) < MAX_BODY_BYTES:
            declared = len(body) + left
            return NoResponse(f"body cut short: {len(body)} of {declared} bytes", sent_at)
        # More past the cap: only the first MAX_BODY_BYTES are compared, never called equal.
        truncated = len(body) == MAX_BODY_BYTES and bool(left or response.read(1))
        headers = tuple(response.getheaders())
        return Response(response.status, headers, body, sent_at, answered_at, truncated)
    except TimeoutError:
        if answered_at:
            return NoResponse(f"body not complete within {timeout:g} s", sent_at)
        return NoResponse(f"no answer within {timeout:g} s", sent_at)
    except (OSError, http.client.HTTPException) as exc:
        # The text may quote the server's bytes (BadStatusLine): escaped, as every server string.
        said = shown(str(exc))
        return NoResponse(f"no answer: {type(exc).__name__}: {said}".rstrip(": "), sent_at)
    finally:
        connection.close()


def send_batch(target: Target, batch: Batch, timeout: float) -> list[Answer]:
    """Send a batch and return one answer per request, in order.

    Several requests are sent at once: every thread connects first, then all wait on a barrier
    and write their request together, so they reach the server as close together as the network
    allows. Raises :class:`Unreachable` when a connection cannot be made.
    """
    if batch.wait > 0:
        time.sleep(batch.wait)  # the Retry-After the endpoint asked for
    if len(batch.requests) == 1:
        return [_exchange(_connect(target, timeout), target, batch.requests[0], timeout)]
    return _send_together(target, batch.requests, timeout)


def _send_together(target: Target, requests: Sequence[Outgoing], timeout: float) -> list[Answer]:
    answers: list[Answer | None] = [None] * len(requests)
    failures: list[Unreachable] = []
    start = threading.Barrier(len(requests))

    def work(index: int) -> None:
        try:
            connection = _connect(target, timeout)
        except Unreachable as exc:
            failures.append(exc)
            start.abort()  # the others stop waiting, and send nothing
            return
        try:
            start.wait(timeout)
        except threading.BrokenBarrierError:
            connection.close()
            return
        answers[index] = _exchange(connection, target, requests[index], timeout)

    threads = [
        threading.Thread(target=work, args=(i,), name=f"idemkey-probe-{i}", daemon=True)
        for i in range(len(requests))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return [
        a if a is not None else NoResponse("not sent: the others could not start") for a in answers
    ]
