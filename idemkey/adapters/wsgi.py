"""IdempotencyMiddleware for any PEP 3333 app (Flask, Django, Falcon, Bottle, plain callables).

::

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, RedisStore(redis.Redis()), Policy())

A ``ProxyFix``-shaped wrapper that only moves bytes; every decision is ``idemkey.http``'s. It
reads ``wsgi.input`` up to ``CONTENT_LENGTH`` (never past it: a peer would hang), or, for a
chunked request (``wsgi.input_terminated``), up to ``max_request_bytes + 1``, and hands the app
the same bytes in a ``BytesIO``. Body chunks go to the server as the app yields them, while a
copy of at most ``max_response_bytes`` is kept for the record. The record completes when the
app's iterable is exhausted, or, if the server closes it early (the client went away), after
the rest has been drained, because the handler's work is done either way.

A WSGI app streams by yielding several blocks without a ``Content-Length``; such a response,
like one over ``max_response_bytes``, is stored without its body (``body_kept=False``). While
the app runs under a claim, ``environ["idemkey.exchange"]`` is the
:class:`~idemkey.http.Exchange` (``.claim.fence`` is the fencing token for downstream writes).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from http import HTTPStatus
from time import perf_counter
from typing import TYPE_CHECKING, Any

from .._core import Claimed
from ..errors import StoreError
from ..http import (
    BodyCopy,
    Complete,
    Exchange,
    Headers,
    Request,
    Response,
    begin,
)
from ._wsgi_body import read_body

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

    from ..policy import Policy
    from ..store import RedisStore

__all__ = ["IdempotencyMiddleware", "claim", "request_of", "settle"]


def claim(store: RedisStore, exchange: Exchange, body: bytes) -> Response | Claimed | None:
    """Claim the record: Claimed (run it), a Response (replay, 409, 422, 503), None (run open)."""
    policy = exchange.policy
    started = perf_counter()
    try:
        decision = store.claim(
            exchange.record,
            exchange.fingerprint(body),
            lease_ms=policy.lease_ms,
            ttl_ms=policy.ttl_ms,
            wait=policy.wait,
        )
    except StoreError as exc:
        return exchange.store_failed(exc)
    return exchange.decide(decision, perf_counter() - started)


def settle(
    store: RedisStore,
    exchange: Exchange,
    status: int | None,
    headers: Any,
    body: bytes | None,
    reason: str = "",
) -> None:
    """Complete or release after the handler; ``status`` None: it failed, release the key.

    A store failure here is reported, never raised: the client still gets its real answer.
    """
    owner = exchange.claim.owner if exchange.claim else ""
    plan = exchange.finish(status, headers, body, reason) if status is not None else None
    started = perf_counter()
    try:
        if isinstance(plan, Complete):
            ttl_ms = exchange.policy.ttl_ms
            stored = store.complete(exchange.record, owner, plan.stored, ttl_ms=ttl_ms)
            exchange.completed(stored, perf_counter() - started)
        else:
            released = store.release(exchange.record, owner)
            reason = plan.reason if plan else "the handler raised"
            exchange.released(reason, released, perf_counter() - started)
    except StoreError as exc:
        exchange.notify("store_error", exchange.claim.fence if exchange.claim else None, str(exc))


class EnvironHeaders(Headers):
    """The request headers of a WSGI environ, read on demand: a request carries a dozen headers
    and idemkey looks at a handful, so copying them all would be most of the adapter's work.
    The server has already joined repeated field lines (PEP 3333): one value per name."""

    __slots__ = ("_environ",)

    def __init__(self, environ: WSGIEnvironment) -> None:  # no super(): nothing to copy
        self._environ = environ

    def get_all(self, name: str) -> list[str]:
        key = _environ_key(name)
        value = self._environ.get(key)
        # Servers set CONTENT_TYPE/CONTENT_LENGTH to "" when the request had none; an empty
        # HTTP_* value is a header sent empty (an empty Idempotency-Key is invalid, not missing).
        if value is None or (not value and key in _UNPREFIXED):
            return []
        return [value]

    def __iter__(self) -> Iterator[str]:
        for key, value in self._environ.items():
            if key.startswith("HTTP_"):
                yield key[5:].replace("_", "-").lower()
            elif key in _UNPREFIXED and value:
                yield key.replace("_", "-").lower()

    def __len__(self) -> int:
        return sum(1 for _ in self)


_UNPREFIXED = frozenset({"CONTENT_TYPE", "CONTENT_LENGTH"})
_ENVIRON_KEYS: dict[str, str] = {}


def _environ_key(name: str) -> str:
    """``Idempotency-Key`` -> ``HTTP_IDEMPOTENCY_KEY``; Content-Type/-Length have no prefix."""
    key = _ENVIRON_KEYS.get(name)
    if key is None:
        key = name.upper().replace("-", "_")
        if key not in _UNPREFIXED:
            key = "HTTP_" + key
        if len(_ENVIRON_KEYS) < 256:  # header names come from code, but stay bounded anyway
            _ENVIRON_KEYS[name] = key
    return key


def request_of(environ: WSGIEnvironment, route: str = "") -> Request:
    """What idemkey sees of a WSGI request; ``route`` is the framework's template, if any."""
    path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
    query = environ.get("QUERY_STRING", "")
    method = environ["REQUEST_METHOD"].upper()
    return Request(method, path or "/", query, EnvironHeaders(environ), route)


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
    """Guard a WSGI app with idempotency keys; ``policy`` defaults to the store's."""

    def __init__(
        self, app: WSGIApplication, store: RedisStore, policy: Policy | None = None
    ) -> None:
        self.app = app
        self.store = store
        self.policy = policy if policy is not None else store.policy

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"].upper() not in self.policy.methods:
            return self.app(environ, start_response)  # the cheap path: nothing to look at
        step = begin(self.policy, request_of(environ))
        if step is None:
            return self.app(environ, start_response)
        if isinstance(step, Response):
            return send(start_response, step)
        body = read_body(environ, step)
        if isinstance(body, Response):
            return send(start_response, body)
        answer = claim(self.store, step, body)
        if answer is None:  # Redis is down and the policy says run unprotected
            return self.app(environ, start_response)
        if isinstance(answer, Response):
            return send(start_response, answer)
        environ["idemkey.exchange"] = step  # the app may read its fence: .claim.fence
        tee = _Tee(self.store, step, start_response)
        try:
            tee.iterable = self.app(environ, tee.start_response)
        except BaseException:
            settle(self.store, step, None, (), None)
            raise
        return tee


class _Tee:
    """The app's body iterable, forwarded chunk by chunk while a bounded copy is kept."""

    def __init__(self, store: RedisStore, exchange: Exchange, start: StartResponse) -> None:
        self.store, self.exchange, self.server_start_response = store, exchange, start
        self.iterable: Iterable[bytes] = ()
        self.iterator: Iterator[bytes] | None = None
        self.status: int | None = None
        self.reason = ""
        self.headers: list[tuple[str, str]] = []
        self.copy = BodyCopy(exchange.policy.max_response_bytes)
        self.settled = False

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
        return chunk

    def finish(self, failed: bool = False) -> None:
        if self.settled:
            return
        self.settled = True
        status = None if failed else self.status
        settle(self.store, self.exchange, status, self.headers, self.copy.body(), self.reason)

    def close(self) -> None:
        """The server is done with us: if it stopped early, drain the app (bounded), then
        complete, because the handler's work is done; always close the app's iterable."""
        try:
            if not self.settled:
                try:
                    for _ in self:
                        if self.copy.too_large:
                            break  # over the limit: stop pulling, complete without the body
                    self.finish()
                except Exception:
                    pass  # __next__ released the key; the server is gone, nobody to tell
        finally:
            close = getattr(self.iterable, "close", None)
            if close is not None:
                close()
