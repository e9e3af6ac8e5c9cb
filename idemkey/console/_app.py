"""The console's Starlette app: the page, the fragment it refreshes, JSON, and forget.

Every route answers only a request whose ``Host`` the console serves (``_guard.HostCheck``:
DNS rebinding), and a read only from the console's own page or a typed address (not from a
page of another site). Read-only unless ``allow_forget``: then ``POST /api/forget`` runs
``store.forget()`` (forget.lua) on a record the page offered (lapsed, or released with steps),
with the state and fence the page showed it with: forget.lua keeps a record a live claim
holds, or that is no longer what the operator confirmed (a retry completed it or claimed it
again meanwhile: 409), and a completed record is never one the page offers. Only for a request
from the page itself: an ``Origin`` among the console's own, and the token this app was made
with (fresh per process), which the page carries in a meta tag and its script sends in
``X-Idemkey-Token``. ``HostCheck`` asks both of every request but a GET or HEAD, whatever its
path, so no route here checks them itself.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from functools import partial
from typing import Any, Final

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from .._core import Record, is_digest, record_from_digest
from .._core._origin import printable_text
from .._core._stored import stored_int
from ..cli._refresh import refresh_seconds
from ..cli.readable import NOT_A_DATE, compact_seconds, shown, utc_time
from ..errors import StoreError
from ..store import RedisStore
from ._guard import TOKEN_HEADER, HostCheck, problem, security_headers, served_hosts
from ._view import MAX_LISTED, ScopeLabels, snapshot

__all__ = ["TOKEN_HEADER", "create_app"]


class _JSON(JSONResponse):
    """Starlette's JSONResponse, its text escaped to ASCII: stored text no UTF-8 encodes (a
    lone surrogate a foreign writer left) goes out as its ``\\u`` escape, never a 500."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def _when(at: float) -> str:
    """An uncertain entry's time (stored data), or :data:`NOT_A_DATE` past what a date holds."""
    stamp = utc_time(at)
    return stamp.strftime("%Y-%m-%d %H:%M:%S") if stamp is not None else NOT_A_DATE


#: What a forget takes: the record, and the state and fence its button was drawn with.
FORGET_BODY: Final = (
    '{"digest": "<32 hex digits>", "state": "lapsed" or "released", "fence": "<the fence '
    'shown, or empty>"}'
)
#: The states the page offers a forget button for; a completed record is never one of them.
OFFERED: Final = ("lapsed", "released")
_MAX_FENCE: Final = 2**64


def _forget_request(prefix: str, body: object) -> tuple[Record, tuple[str, int | None]] | str:
    """The record a forget names and the (state, fence) the page showed it with, or why the
    body is not one: the page always sends all three."""
    if not isinstance(body, dict):
        return f"the body must be JSON: {FORGET_BODY}"
    digest, state, fence = body.get("digest"), body.get("state"), body.get("fence", False)
    if not isinstance(digest, str) or not is_digest(digest):
        return "digest must be the record's 32 hex digits"
    if state not in OFFERED:
        return f"state must be the one the page showed: {' or '.join(OFFERED)}"
    if isinstance(fence, str) and (number := stored_int(fence)) is not None:
        fence = number
    if fence in ("", None):
        fence = None
    elif type(fence) is not int or not 0 <= fence < _MAX_FENCE:
        return "fence must be the one the page showed: its digits, or empty when it showed none"
    return record_from_digest(prefix, digest), (state, fence)


def create_app(
    store: RedisStore,
    *,
    refresh: float = 3.0,
    allow_forget: bool = False,
    host: str = "127.0.0.1",
    port: int = 8089,
    allow_hosts: Iterable[str] = (),
    token: str | None = None,
) -> Starlette:
    """The console for the records under ``store``'s prefix, refreshed every ``refresh`` s,
    served on ``host``:``port``: it answers only requests whose ``Host`` names that address
    (the loopback names, ``host``, ``allow_hosts``; see ``_guard.served_hosts``). A forget
    needs ``allow_forget`` and ``token`` (made here when None, fresh for each app).
    ``refresh`` out of 0.5 s to a day is a :class:`~idemkey.errors.ConfigurationError`
    (``refresh_seconds``: a browser's timer overflows past 24.8 days and fires at once)."""
    refresh_ms = round(refresh_seconds(refresh) * 1000)
    hosts = served_hosts(host, port, allow_hosts)
    origins = frozenset(f"http://{name}" for name in hosts)
    token = token or secrets.token_urlsafe(32)
    templates = Environment(
        loader=PackageLoader("idemkey.console", "templates"),
        autoescape=select_autoescape(["html"]),
    )
    templates.filters["secs"] = compact_seconds
    templates.filters["when"] = _when
    # Stored text as `idemkey list` prints it: a route, scope or key as one printable token
    # (%XX), any other text with Python escapes; so no bidirectional override reaches the
    # page raw to reorder what the operator reads (autoescaping does not touch it).
    templates.filters["printable"] = printable_text
    templates.filters["shown"] = shown
    labels = ScopeLabels()  # one secret per console: a tenant's rows keep one label

    def render(name: str, **context: Any) -> str:
        return templates.get_template(name).render(
            allow_forget=allow_forget, max_listed=MAX_LISTED, **context
        )

    def view() -> tuple[Any, str]:
        try:
            return snapshot(store, labels), ""
        except StoreError as exc:
            return None, str(exc)

    def page(request: Request) -> Response:
        nonce = secrets.token_urlsafe(16)
        shot, error = view()
        html = render(
            "console.html",
            shot=shot,
            error=error,
            nonce=nonce,
            token=token if allow_forget else "",
            refresh_ms=refresh_ms,
            prefix=store.policy.prefix,
        )
        return HTMLResponse(html, headers=security_headers(nonce))

    def fragment(request: Request) -> Response:
        shot, error = view()
        html = render("view.html", shot=shot, error=error)
        return HTMLResponse(html, status_code=503 if error else 200, headers=security_headers(None))

    def status(request: Request) -> Response:
        shot, error = view()
        if shot is None:
            return problem(503, f"Redis is unavailable: {error}", "Redis is unavailable")
        return _JSON(shot.as_dict(), headers=security_headers(None))

    async def forget(request: Request) -> Response:  # HostCheck asked for Origin and token
        try:
            body = await request.json()
        except (ValueError, RecursionError):  # RecursionError: nested past what json reads
            return problem(400, f"the body must be JSON: {FORGET_BODY}")
        asked = _forget_request(store.policy.prefix, body)
        if isinstance(asked, str):
            return problem(400, asked)
        record, seen = asked
        try:
            found = await run_in_threadpool(partial(store.forget, record, seen=seen))
        except StoreError as exc:  # Redis failed: an answer, never a traceback
            return problem(503, f"Redis failed: {exc}")
        if found.held:
            return problem(409, "a live claim holds this record now; nothing deleted")
        if found.changed and found.state:
            # A retry claimed it since the page was drawn: completed (its answer is what the
            # next retry replays) or lapsed again under a new fence. Not what was confirmed.
            return problem(
                409,
                f"the record is {found.state} now, not the {seen[0]} record (fence "
                f"{seen[1] if seen[1] is not None else '-'}) the page showed: nothing deleted; "
                "look at it again",
            )
        if not found.forgotten:
            return problem(404, "no such record (forgotten already, or expired?)")
        answer = {"record": record.record_key, "deleted": found.deleted, "state": found.state}
        return _JSON(answer, headers=security_headers(None))

    async def refused(request: Request, exc: Exception) -> Response:
        # The router's own answers (a path it does not serve, a method a route does not take)
        # are problems with the security headers too, not Starlette's bare text/plain.
        assert isinstance(exc, HTTPException)
        where = repr(request.url.path[:100])
        allow = (exc.headers or {}).get("Allow")
        if not allow:
            return problem(exc.status_code, f"no page {where} here")
        allow = ", ".join(sorted(allow.split(", ")))  # Starlette joins a set: one order
        answer = problem(exc.status_code, f"{where} answers {allow} only")
        answer.headers["Allow"] = allow  # a 405 names the methods the path takes (RFC 9110)
        return answer

    routes = [
        Route("/", page),
        Route("/fragment", fragment),
        Route("/api/status", status),
        Route("/api/forget", forget, methods=["POST"]),
    ]
    gate = Middleware(
        HostCheck, hosts=hosts, origins=origins, token=token if allow_forget else None
    )
    return Starlette(
        routes=routes, middleware=[gate], exception_handlers={404: refused, 405: refused}
    )
