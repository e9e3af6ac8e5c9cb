"""The I/O shell over ``httpx``: :class:`AsyncClient` and :class:`AsyncIdempotentTransport`.

The source of its blocking twin ``_sync.py``, which ``scripts/unasync.py`` generates with the
store's and the guard's (``tests/test_generated.py`` checks for drift). Every decision is in
``_retry.py`` and every action on one in ``_shell.py``: a shell only sends, reads and sleeps.
"""

# unasync: generates _sync.py
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection
from types import TracebackType
from typing import Any, NoReturn

import httpx

from ..errors import ConfigurationError
from ..store._concurrency._async_runtime import sleep
from ._async_attempt import drain, exchange
from ._errors import UnusableAnswerError
from ._operation import DEFAULT_HEADER, IdempotentResponse, Operation, RetryHook
from ._options import (
    check_hook,
    check_http_options,
    check_instance,
    header_name,
    method_names,
    refuse_unknown,
)
from ._retry import RetryPolicy, Schedule
from ._shell import (
    DEFAULT_RETRY,
    Preparing,
    ReplayCheck,
    check_replay,
    failure_kind,
    redirect_to_follow,
    replay_check,
    replayable,
    settle,
    unretried,
    unusable_answer,
)

__all__ = ["AsyncClient", "AsyncIdempotentTransport", "arun"]


async def arun(
    start: Callable[[httpx.Request], Awaitable[httpx.Response]],
    operation: Operation,
    policy: RetryPolicy,
    on_retry: RetryHook | None = None,
    *,
    transport: bool = False,
) -> IdempotentResponse:
    """Send ``operation`` through ``start`` (which returns a response not read yet) until it
    settles; each attempt, its whole answer read, fits in what is left of the deadline."""
    schedule = Schedule(policy, time.monotonic())
    while True:
        budget = schedule.send(time.monotonic())
        request = operation.attempt(budget)
        response: httpx.Response | None = None
        error: httpx.HTTPError | None = None
        try:
            response = await exchange(start, request, budget, operation.timeout)
        except httpx.HTTPError as exc:
            kind = failure_kind(exc)
            if kind is None:
                if transport:
                    raise  # a transport raises what httpx would
                if unusable_answer(exc):
                    # The handler may have run, and a post() never showed its key.
                    raise UnusableAnswerError(operation.key, schedule.attempts) from exc
                if schedule.attempts > 1:
                    # An earlier attempt may have reached the handler: the key must reach
                    # the caller, or a post() retried by hand would run it again.
                    raise unretried(exc, operation, schedule.attempts) from exc
                raise  # a bad URL: the first attempt sent nothing
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
        await sleep(outcome)


class AsyncClient(Preparing):
    """An ``httpx.AsyncClient`` sending each POST/PATCH as one idempotent call, retried safely.

    Wrap your own (``AsyncClient(httpx.AsyncClient(base_url=..., auth=...))``) or let this one
    build it from httpx options (``AsyncClient(base_url=..., timeout=2.0)``); ``client.http`` is the
    httpx client, for every call that needs no key. With ``follow_redirects=True`` a keyed call
    follows redirects on its own origin only: one to another origin is the call's answer.
    """

    http: httpx.AsyncClient

    def __init__(
        self,
        http: httpx.AsyncClient | None = None,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        on_retry: RetryHook | None = None,
        header: str = DEFAULT_HEADER,
        on_replay: ReplayCheck = "accept",
        **options: Any,
    ) -> None:
        where = "AsyncClient"
        if http is None:
            check_http_options(where, httpx.AsyncClient, options)
        else:
            check_instance(where, "http", http, httpx.AsyncClient, "an httpx.AsyncClient or None")
            if options:
                names = ", ".join(f"{name}=..." for name in sorted(options))
                raise ConfigurationError(
                    f"{where}(http=..., {names}): pass an httpx.AsyncClient or httpx options, "
                    "not both"
                )
        self.retry = check_instance(where, "retry", retry, RetryPolicy, "a RetryPolicy")
        self.on_retry = check_hook(where, "on_retry", on_retry)
        self.on_replay = replay_check(where, on_replay)
        self.header = header_name(where, "header", header)
        self.http = http if http is not None else httpx.AsyncClient(**options)
        self._owns_http = http is None

    async def send(self, operation: Operation) -> IdempotentResponse:
        """Send ``operation`` until it has an answer; raises ``RefusedError`` on a refusal
        (``422 key_reused``...) and ``RetriesExhaustedError`` past the deadline."""
        reply = await arun(self._start, operation, self.retry, self.on_retry)
        return check_replay(self.on_replay, reply)

    async def _start(self, request: httpx.Request) -> httpx.Response:
        """One attempt's response, not read yet; redirects followed on the call's own origin
        only (:func:`~idemkey.client._shell.redirect_to_follow`), else as httpx does."""
        origin = request.url
        history: list[httpx.Response] = []
        while True:
            response = await self.http.send(request, stream=True, follow_redirects=False)
            after = redirect_to_follow(self.http, origin, response)
            if after is None:
                response.history = history
                return response
            await drain(response)
            if len(history) >= self.http.max_redirects:  # httpx's limit, counted as httpx does
                raise httpx.TooManyRedirects("Exceeded maximum allowed redirects.", request=after)
            history.append(response)
            request = after

    async def post(self, url: httpx.URL | str, **kwargs: Any) -> IdempotentResponse:
        """``send(prepare("POST", url, **kwargs))``: takes ``json=``, ``idempotency_key=``..."""
        return await self.send(self.prepare("POST", url, **kwargs))

    async def patch(self, url: httpx.URL | str, **kwargs: Any) -> IdempotentResponse:
        """``send(prepare("PATCH", url, **kwargs))``."""
        return await self.send(self.prepare("PATCH", url, **kwargs))

    async def aclose(self) -> None:
        """Close the httpx client if this object built it."""
        if self._owns_http:
            await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class AsyncIdempotentTransport(httpx.AsyncBaseTransport):
    """Mount on an ``httpx.AsyncClient``: POST/PATCH get a key (unless they carry one) and retries.

    ``httpx.AsyncClient(transport=AsyncIdempotentTransport())``. It raises only httpx errors
    (and ``InvalidKeyError``, before sending, for an invalid key set on the request): a refusal
    comes back as its response, and giving up returns the last response or raises the last
    httpx error. The key is on ``response.request.headers``; set the header yourself to know
    (and persist) it before the first attempt. httpx follows redirects above a transport,
    where it cannot see them: keep ``follow_redirects`` off (httpx's default) on its client.
    """

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        on_retry: RetryHook | None = None,
        header: str = DEFAULT_HEADER,
        methods: Collection[str] = ("POST", "PATCH"),
        **unknown: NoReturn,
    ) -> None:
        where = "AsyncIdempotentTransport"
        refuse_unknown(where, unknown, ("transport", "retry", "on_retry", "header", "methods"))
        if transport is not None:
            expected = "an httpx.AsyncBaseTransport (httpx.AsyncHTTPTransport(...)) or None"
            check_instance(where, "transport", transport, httpx.AsyncBaseTransport, expected)
        self.retry = check_instance(where, "retry", retry, RetryPolicy, "a RetryPolicy")
        self.on_retry = check_hook(where, "on_retry", on_retry)
        self.header = header_name(where, "header", header)
        self.methods = method_names(where, "methods", methods)
        self.transport = transport if transport is not None else httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through the wrapped transport: a POST or PATCH (``methods``) with
        one key for all its attempts, retried under ``retry``; any other method, and a body that
        is an async stream (with a warning: it cannot be sent twice), as it is."""
        if request.method not in self.methods or not replayable(request):
            return await self.transport.handle_async_request(request)
        operation = Operation.from_request(request, self.header)
        # httpx reports this request on the response (response.request): let it carry the key
        # every attempt sent, for the caller's logs, as an auth flow leaves its header there.
        request.headers[self.header] = operation.headers[self.header]
        reply = await arun(
            self.transport.handle_async_request, operation, self.retry, self.on_retry,
            transport=True,
        )  # fmt: skip
        return reply.response

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self.transport.aclose()
