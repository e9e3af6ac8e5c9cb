"""Whom the console answers: the Host it serves, the Origin of its own page, its token.

A page on 127.0.0.1 is reachable from any web site through DNS rebinding: a name the attacker
controls (``evil.example``) first resolves to the attacker's server, which serves a script, then
to 127.0.0.1; the browser then treats the console as that site's own origin, so the script
reads its pages and posts to it. What such a request cannot forge is the ``Host`` header: the
browser sends the name it resolved (``evil.example:8089``). So the console answers only the
Hosts it serves (:class:`HostCheck`, around every route, reads included, as Django's
``ALLOWED_HOSTS`` and Starlette's ``TrustedHostMiddleware`` do), a state-changing request must
come from one of their origins (compared with the configured ones, never with one built from
the request's own Host), and it carries a token made afresh for each console process, which
only a page read from the console holds (Jupyter's token). Both are checked here, for every
method but GET and HEAD on every path, so a route added later cannot forget them.

A page of another site needs no rebinding to make the console work: ``<img src>`` or a
no-cors ``fetch`` of ``http://127.0.0.1:8089/api/status`` carries the console's own Host, and
though it cannot read the answer, each one is a SCAN of the whole prefix, at the rate that page
picks. So a read is refused too when the browser says it comes from elsewhere:
``Sec-Fetch-Site`` other than ``same-origin`` (the page's own fetches) or ``none`` (an address
typed or bookmarked), or an ``Origin`` that is not the console's. A client that is no browser
sends neither, and is answered.
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Final

from starlette.responses import JSONResponse, Response

__all__ = [
    "OWN_FETCHES",
    "READS",
    "TOKEN_HEADER",
    "HostCheck",
    "LOOPBACK_NAMES",
    "is_loopback",
    "problem",
    "security_headers",
    "served_hosts",
]

#: The header the page's script sends its token in with a confirmed forget.
TOKEN_HEADER: Final = "X-Idemkey-Token"
#: The methods that change nothing: the only ones answered without the page's Origin and token.
READS: Final = frozenset({"GET", "HEAD"})
#: The ``Sec-Fetch-Site`` of a read the console answers: its own page's, or the operator's own
#: navigation (an address typed, a bookmark).
OWN_FETCHES: Final = frozenset({b"same-origin", b"none"})

#: The names of the loopback interface a browser on this machine uses for the console.
LOOPBACK_NAMES: Final = ("127.0.0.1", "localhost", "[::1]")

_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_App = Callable[[_Scope, _Receive, _Send], Awaitable[None]]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable only from this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _with_port(name: str, port: int) -> str:
    """``name`` as a Host header names it: an IPv6 address bracketed, the port added unless
    ``name`` has one."""
    name = name.strip().lower()
    bare = name.strip("[]")
    try:
        if ipaddress.ip_address(bare).version == 6:
            return f"[{bare}]:{port}"
    except ValueError:
        pass
    if name.startswith("["):  # "[::1]:9000"
        return name if "]:" in name else f"{name}:{port}"
    return name if ":" in name else f"{name}:{port}"


def served_hosts(host: str, port: int, extra: Iterable[str] = ()) -> frozenset[str]:
    """The ``Host`` values the console answers when it listens on ``host``:``port``: the
    loopback names with its port, ``host`` itself unless it is a wildcard (0.0.0.0, ::), and
    each of ``extra`` (``--allow-host``: an SSH tunnel's ``localhost:9000``, a machine name),
    with the port when it names none. On port 80 a browser sends no port: the bare names too."""
    names = {_with_port(name, port) for name in LOOPBACK_NAMES}
    if host.strip("[]") not in ("0.0.0.0", "::", ""):
        names.add(_with_port(host, port))
    names.update(_with_port(name, port) for name in extra)
    if port == 80:
        names.update({name.removesuffix(":80") for name in names})
    return frozenset(names)


def security_headers(nonce: str | None) -> dict[str, str]:
    """Nothing loaded from elsewhere, nothing sent elsewhere: the page's own script and style
    (by nonce) and requests to this server only."""
    own = f"'nonce-{nonce}'" if nonce else "'none'"
    policy = (
        f"default-src 'none'; script-src {own}; style-src {own}; connect-src 'self'; "
        "img-src 'none'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    )
    return {
        "Content-Security-Policy": policy,
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }


def problem(status: int, detail: str, title: str = "refused") -> Response:
    """An RFC 9457 problem."""
    return JSONResponse(
        {"type": "about:blank", "title": title, "status": status, "detail": detail},
        status_code=status,
        media_type="application/problem+json",
        headers=security_headers(None),
    )


class HostCheck:
    """ASGI middleware: an HTTP request whose ``Host`` is not one of ``hosts`` gets a 400
    problem and never reaches the app (a request without a Host too). A GET or HEAD that a
    browser says comes from another site (``Sec-Fetch-Site`` but ``same-origin`` or ``none``,
    an ``Origin`` not among ``origins``) gets a 403. Any other method, on any path, needs an
    ``Origin`` among ``origins`` and ``token`` in :data:`TOKEN_HEADER`, else a 403; with no
    ``token`` (a read-only console) it is refused outright. Other scopes (lifespan) pass
    through; the console serves no websocket."""

    def __init__(
        self, app: _App, hosts: frozenset[str], origins: frozenset[str], token: str | None
    ) -> None:
        self.app = app
        self.hosts = hosts
        self.origins = origins
        self.token = token.encode() if token else None

    def _refusal(self, scope: _Scope) -> Response | None:
        # Reversed, so a repeated header keeps its first value, the one Starlette reads.
        headers = dict(reversed(scope["headers"]))
        host = headers.get(b"host", b"").decode("latin-1").lower()
        if host not in self.hosts:
            return problem(
                400,
                f"this console answers only to Host {' or '.join(sorted(self.hosts))}, "
                f"not {host[:100]!r} (a DNS rebinding?); a name of your own: --allow-host",
            )
        if scope["method"] in READS:
            site = headers.get(b"sec-fetch-site")
            origin = headers.get(b"origin")
            if (site is not None and site.lower() not in OWN_FETCHES) or (
                origin is not None and origin.decode("latin-1") not in self.origins
            ):
                return problem(
                    403,
                    "this console answers reads only from its own page or an address typed or "
                    "bookmarked, not a request from another site (Sec-Fetch-Site, Origin)",
                )
            return None
        if self.token is None:
            return problem(403, "forget is off: start the console with --allow-forget")
        if headers.get(b"origin", b"").decode("latin-1") not in self.origins:
            return problem(403, "a forget must come from the console's own page (Origin)")
        if not secrets.compare_digest(headers.get(TOKEN_HEADER.lower().encode(), b""), self.token):
            return problem(403, f"a forget needs this console's token ({TOKEN_HEADER})")
        return None

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] == "http":
            refused = self._refusal(scope)
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)
