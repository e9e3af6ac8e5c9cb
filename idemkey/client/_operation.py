"""One logical call, frozen before its first attempt, and what the sync and async shells share.

An :class:`Operation` holds the key and the request bytes, built and serialised once: every
attempt sends a fresh ``httpx.Request`` over the very same bytes (a multipart boundary is drawn
once), so the server's fingerprint matches and a retry is a replay, never a ``422``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from .._core import parse_key
from ..errors import ConfigurationError, InvalidKeyError

__all__ = [
    "DEFAULT_HEADER",
    "IdempotentResponse",
    "Operation",
    "RetryEvent",
    "RetryHook",
]

DEFAULT_HEADER: Final = "Idempotency-Key"
REPLAYED_HEADER: Final = "Idempotent-Replayed"

#: The longest timeout an attempt is given, in seconds: what the platform's lock waits accept,
#: which its sockets accept too (a deadline of sys.maxsize, a timeout past it, overflowed
#: ``socket.settimeout``). Some 292 years on Linux, 49 days on Windows: none, in effect.
LONGEST: Final = threading.TIMEOUT_MAX


@dataclass(frozen=True, slots=True)
class Operation:
    """One logical call: its key and its bytes, the same on every attempt.

    Persist ``key`` before sending if a process restart must not charge twice, and pass it back
    as ``idempotency_key=`` to finish the call later. Build one with ``Client.prepare``.
    ``extensions`` are the request's httpx extensions but its ``timeout`` (``target``,
    ``sni_hostname``, ``trace``...), which every attempt carries.
    """

    method: str
    url: httpx.URL
    key: str
    headers: httpx.Headers
    content: bytes
    timeout: dict[str, float | None]
    extensions: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_request(
        cls, request: httpx.Request, header: str = DEFAULT_HEADER, key: str | None = None
    ) -> Operation:
        """Freeze ``request``: read its body once, and give it ``key`` (or its own, or a UUID).

        A key is given as the server reads the header: bare (``order-42``) or in RFC 8941
        quotes (``"order-42"``), and sent in the form given; ``Operation.key`` is the key
        itself (``order-42``), the one the server stores under.
        """
        if key is None:
            given = request.headers.get(header)
            # An empty header is a key the caller set, and an invalid one: not a call for a UUID.
            key = str(uuid.uuid4()) if given is None else given
        key, field = _key_and_field(key)
        if not isinstance(request.stream, Iterable):
            raise ConfigurationError(
                "an idempotent call must be re-sent byte for byte: pass bytes, json=, data= or "
                "files=, not an async stream"
            )
        content = request.read()
        headers = request.headers.copy()
        headers[header] = field
        # The body is bytes now: frame it with a length, whatever the stream was.
        headers.pop("Transfer-Encoding", None)
        headers["Content-Length"] = str(len(content))
        extensions = dict(request.extensions)
        timeout = extensions.pop("timeout", {})
        return cls(request.method, request.url, key, headers, content, dict(timeout), extensions)

    def attempt(self, budget: float) -> httpx.Request:
        """A fresh request over the same bytes and extensions; every timeout clipped to ``budget``
        seconds, and to :data:`LONGEST`."""
        budget = min(max(budget, 0.001), LONGEST)
        timeout = {
            name: budget if value is None else min(value, budget)
            for name, value in (
                self.timeout or dict.fromkeys(("connect", "read", "write", "pool"))
            ).items()
        }
        return httpx.Request(
            self.method,
            self.url,
            headers=self.headers,
            stream=httpx.ByteStream(self.content),
            extensions={**self.extensions, "timeout": timeout},
        )


def _key_and_field(value: object) -> tuple[str, str]:
    """The key that the field value ``value`` carries, and ``value`` as sent; or InvalidKeyError
    (before anything is sent, rather than a 400 ``invalid_key`` from the server)."""
    if not isinstance(value, str):
        raise InvalidKeyError(f"the key must be a string, not {type(value).__name__}")
    key = parse_key(value)
    field = value.strip(" \t")  # what the server strips; a header value cannot start with a space
    if field != key:
        # The quoted form. Its key must be one the bare form carries too: operation.key is
        # passed back as idempotency_key= to resume a call, and `a b` unquoted is invalid.
        try:
            bare = parse_key(key) == key
        except InvalidKeyError:
            bare = False
        if not bare:
            raise InvalidKeyError(
                "a key in quotes must be valid unquoted too (visible ASCII characters, without "
                "spaces or commas), to be passed back as idempotency_key="
            )
    return key, field


@dataclass(frozen=True, slots=True)
class IdempotentResponse:
    """The call's answer: ``response`` (read), the ``key`` it used, and how many ``attempts``.

    ``replayed`` is True when the server answered with the stored response of an earlier
    attempt (``Idempotent-Replayed: true``): the handler did not run again.
    """

    response: httpx.Response
    key: str
    attempts: int
    #: Whether an earlier attempt of the call was lost (it may have reached the handler): a
    #: replay after one is the call's own answer (``on_replay="refuse"`` accepts it).
    after_lost: bool = False

    @property
    def replayed(self) -> bool:
        value: str = self.response.headers.get(REPLAYED_HEADER, "")
        return value.lower() == "true"

    @property
    def status_code(self) -> int:
        return self.response.status_code

    @property
    def headers(self) -> httpx.Headers:
        return self.response.headers

    @property
    def content(self) -> bytes:
        return self.response.content

    def json(self) -> Any:
        """The body decoded as JSON (``httpx.Response.json``)."""
        return self.response.json()


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """What the ``on_retry`` hook receives before each wait."""

    operation: Operation
    attempt: int  # the attempt that failed, 1-based
    reason: str  # "timeout", "protocol", "503", "409 in_flight", ...
    delay: float  # seconds the client now waits
    retry_after: float | None  # what the server asked for, if anything


RetryHook = Callable[[RetryEvent], None]
