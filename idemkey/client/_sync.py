"""The blocking shell over ``httpx``: :class:`Client` and :class:`IdempotentTransport`.

Generated from ``_async.py`` by ``python -m tests.client.unasync``: edit that file, not this
one (``tests/client/test_unasync.py`` fails on drift). Every decision is in ``_retry.py`` and
every action on one in ``_shell.py``: a shell only sends, reads and sleeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from types import TracebackType
from typing import Any

import httpx

from ..errors import ConfigurationError
from ._operation import DEFAULT_HEADER, IdempotentResponse, Operation, RetryHook
from ._retry import RetryPolicy, Schedule
from ._shell import DEFAULT_RETRY, Preparing, failure_kind, settle

__all__ = ["Client", "IdempotentTransport", "run"]


def run(
    send: Callable[[httpx.Request], httpx.Response],
    operation: Operation,
    policy: RetryPolicy,
    on_retry: RetryHook | None = None,
    *,
    transport: bool = False,
) -> IdempotentResponse:
    """Send ``operation`` through ``send`` (which returns a read response) until it settles."""
    schedule = Schedule(policy, time.monotonic())
    while True:
        request = operation.attempt(schedule.send(time.monotonic()))
        response: httpx.Response | None = None
        error: httpx.TransportError | None = None
        try:
            response = send(request)
        except httpx.TransportError as exc:
            kind = failure_kind(exc)
            if kind is None:
                raise
            error = exc
            step = schedule.failed(kind, time.monotonic())
        else:
            status, headers, body = response.status_code, response.headers, response.content
            step = schedule.answered(status, headers, body, time.monotonic(), time.time())
        outcome = settle(
            step, schedule.attempts, operation, response, error, on_retry, transport=transport
        )
        if isinstance(outcome, IdempotentResponse):
            return outcome
        time.sleep(outcome)


class Client(Preparing):
    """An ``httpx.Client`` sending each POST/PATCH as one idempotent call, retried safely.

    Wrap your own (``Client(httpx.Client(base_url=..., auth=...))``) or let this one
    build it from httpx options (``Client(base_url=..., timeout=2.0)``); ``client.http`` is the
    httpx client, for every call that needs no key.
    """

    http: httpx.Client

    def __init__(
        self,
        http: httpx.Client | None = None,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        on_retry: RetryHook | None = None,
        header: str = DEFAULT_HEADER,
        **options: Any,
    ) -> None:
        if http is not None and options:
            raise ConfigurationError("pass an httpx.Client or httpx options, not both")
        self.http = http if http is not None else httpx.Client(**options)
        self._owns_http = http is None
        self.retry = retry
        self.on_retry = on_retry
        self.header = header

    def send(self, operation: Operation) -> IdempotentResponse:
        """Send ``operation`` until it has an answer; raises ``RefusedError`` on a refusal
        (``422 key_reused``...) and ``RetriesExhaustedError`` past the deadline."""
        return run(self.http.send, operation, self.retry, self.on_retry)

    def post(self, url: httpx.URL | str, **kwargs: Any) -> IdempotentResponse:
        """``send(prepare("POST", url, **kwargs))``: takes ``json=``, ``idempotency_key=``..."""
        return self.send(self.prepare("POST", url, **kwargs))

    def patch(self, url: httpx.URL | str, **kwargs: Any) -> IdempotentResponse:
        """``send(prepare("PATCH", url, **kwargs))``."""
        return self.send(self.prepare("PATCH", url, **kwargs))

    def close(self) -> None:
        """Close the httpx client if this object built it."""
        if self._owns_http:
            self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class IdempotentTransport(httpx.BaseTransport):
    """Mount on an ``httpx.Client``: POST/PATCH get a key (unless they carry one) and retries.

    ``httpx.Client(transport=IdempotentTransport())``. It raises only httpx errors:
    a refusal comes back as its response, and giving up returns the last response or raises
    the last httpx error. Set the header yourself to know (and persist) the key.
    """

    def __init__(
        self,
        transport: httpx.BaseTransport | None = None,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        on_retry: RetryHook | None = None,
        header: str = DEFAULT_HEADER,
        methods: Collection[str] = ("POST", "PATCH"),
    ) -> None:
        self.transport = transport if transport is not None else httpx.HTTPTransport()
        self.retry = retry
        self.on_retry = on_retry
        self.header = header
        self.methods = frozenset(method.upper() for method in methods)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method not in self.methods:
            return self.transport.handle_request(request)
        operation = Operation.from_request(request, self.header)
        reply = run(self._send, operation, self.retry, self.on_retry, transport=True)
        return reply.response

    def _send(self, request: httpx.Request) -> httpx.Response:
        response = self.transport.handle_request(request)
        try:
            response.read()
        finally:
            response.close()
        return response

    def close(self) -> None:
        self.transport.close()
