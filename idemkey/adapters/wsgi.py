"""IdempotencyMiddleware for any PEP 3333 app (Flask, Django, Falcon, Bottle, plain callables).

::

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, RedisStore(redis.Redis()), Policy())

A ``ProxyFix``-shaped wrapper that only moves bytes: the order of the steps is the driver's
(``_sync_driver``), every decision ``idemkey.http``'s, the body read as ``_environ`` says.
Body chunks go to the server as the app yields them, with a copy of at most
``max_response_bytes`` kept. The record completes when the app's iterable is exhausted, or, if
the server closes it early (the client left), after draining the rest, because the work is done
either way; the drain stops past ``max_response_bytes`` or after :data:`DRAIN_SECONDS`, and
the record then completes without its body (``body_kept=False``, as for a streamed or oversized
response). ``environ["idemkey.exchange"]`` is the :class:`~idemkey.http.Exchange` while the app
runs under a claim (``.claim.fence`` is the fencing token for downstream writes).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from http import HTTPStatus
from time import monotonic
from typing import TYPE_CHECKING, Any, Final

from ..http import BodyCopy, Response, begin
from ..routes import KnownRoute, Routes
from ._environ import EnvironHeaders, read_body, request_of
from ._lifecycle import Lifecycle
from ._sync_driver import Driver

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

    from ..policy import Policy
    from ..store import RedisStore

__all__ = ["DRAIN_SECONDS", "EnvironHeaders", "IdempotencyMiddleware"]

#: How long the middleware keeps pulling an app's body after the server closed it early (the
#: client left), measured between blocks: a sync worker serves nobody else meanwhile.
DRAIN_SECONDS: Final = 1.0


def send(start_response: StartResponse, response: Response) -> list[bytes]:
    reason = response.reason  # a replay's own phrase ("201 Charged OK"), else the standard one
    if not reason:
        try:
            reason = HTTPStatus(response.status).phrase
        except ValueError:
            reason = "Unknown"
    start_response(f"{response.status} {reason}", response.headers)
    return [response.body]


class IdempotencyMiddleware:
    """Guard a WSGI app with idempotency keys; ``policy`` defaults to the store's.

    ``routes`` (:class:`~idemkey.routes.Routes`) chooses the guarded paths and their options;
    without it every path is guarded for ``policy.methods``. Requests that are not guarded pass
    straight through: no Redis call, no body read.
    """

    def __init__(
        self,
        app: WSGIApplication,
        store: RedisStore,
        policy: Policy | None = None,
        *,
        routes: Routes | KnownRoute | None = None,
    ) -> None:
        self.app = app
        self.store = store
        self.policy = policy if policy is not None else store.policy
        self.routes = routes.bind(self.policy) if routes is not None else None
        self.driver = Driver(store)

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"].upper()
        if self.routes is None:
            if method not in self.policy.methods:
                return self.app(environ, start_response)  # the cheap path: nothing to look at
            policy, route = self.policy, ""
        else:
            path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
            selected = self.routes.select(method, path or "/")
            if selected is None:
                return self.app(environ, start_response)
            policy, route = selected.policy, selected.route
        step = begin(policy, request_of(environ, route))
        if step is None:
            return self.app(environ, start_response)
        if isinstance(step, Response):
            return send(start_response, step)
        lifecycle = Lifecycle(step)
        body = read_body(environ, lifecycle)
        if isinstance(body, Response):
            return send(start_response, body)
        answer = self.driver.claim(lifecycle)
        if answer is not None:
            return send(start_response, answer)
        if lifecycle.unprotected:  # Redis is down and the policy says run unprotected
            return self.app(environ, start_response)
        environ["idemkey.exchange"] = step  # the app may read its fence: .claim.fence
        tee = _Tee(self.driver, lifecycle, start_response)
        try:
            tee.iterable = self.app(environ, tee.start_response)
        except BaseException:
            self.driver.fail(lifecycle, "the handler raised")
            raise
        return tee


class _Tee:
    """The app's body iterable, forwarded chunk by chunk while a bounded copy is kept."""

    def __init__(self, driver: Driver, lifecycle: Lifecycle, start: StartResponse) -> None:
        self.driver, self.lifecycle, self.server_start_response = driver, lifecycle, start
        self.iterable: Iterable[bytes] = ()
        self.iterator: Iterator[bytes] | None = None
        self.status: int | None = None
        self.reason = ""
        self.headers: list[tuple[str, str]] = []
        self.copy = BodyCopy(lifecycle.exchange.policy.max_response_bytes)
        self.settled = False
        self.body_started = False  # a non-empty chunk went out: the head is the client's

    def start_response(self, status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
        write = self.server_start_response(status, headers, *exc_info)
        self.status, self.headers, self.reason = int(status[:3]), headers, status[4:]
        self.copy.start(headers)

        def tee_write(data: bytes) -> None:  # the legacy write() callable: keep a copy too
            self.copy.add(data)
            write(data)

        return tee_write

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        try:
            if self.iterator is None:
                self.iterator = iter(self.iterable)
            chunk = next(self.iterator)
        except StopIteration:
            self.finish()
            raise
        except BaseException:
            self.finish(failed=True)
            raise
        self.copy.add(chunk)
        self.body_started = self.body_started or bool(chunk)
        return chunk

    def finish(self, failed: bool = False) -> None:
        if self.settled:
            return
        self.settled = True
        # WSGI lets an app replace its status until the first body byte (exc_info): the head
        # counts as sent from then on, and a failure after it completes without the body
        # (the lifecycle's rule, as under ASGI); a failure before it releases the key.
        if self.status is not None and (self.body_started or not failed):
            self.lifecycle.started(self.status, self.headers, self.reason)
        if failed or self.status is None:
            self.driver.fail(self.lifecycle, "the handler raised")
            return
        self.driver.finish(self.lifecycle, self.copy.body())

    def close(self) -> None:
        """The server is done with us: if it stopped early, drain the app (bounded in bytes
        and time), then complete, because the handler's work is done; always close the app's
        iterable."""
        try:
            if not self.settled:
                deadline = monotonic() + DRAIN_SECONDS
                try:
                    for _ in self:
                        if self.copy.too_large or monotonic() > deadline:
                            self.copy.drop()  # stop pulling: complete without the body
                            break
                    self.finish()
                except Exception:
                    pass  # __next__ released the key; the server is gone, nobody to tell
        finally:
            close = getattr(self.iterable, "close", None)
            if close is not None:
                close()
