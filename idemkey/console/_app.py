"""The console's Starlette app: the page, the fragment it refreshes, JSON, and forget.

Read-only unless ``allow_forget``: then ``POST /api/forget`` deletes a record that no live
claim holds (lapsed, released or complete), and only for a request from the page itself (same
origin, the confirmation header the page's script sends once the operator confirmed).
"""

from __future__ import annotations

import re
import secrets
from datetime import datetime, timezone
from typing import Any, Final

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ..cli._format import compact_seconds
from ..errors import StoreError
from ..store import RedisStore
from ._view import MAX_LISTED, snapshot

__all__ = ["CONFIRM_HEADER", "create_app"]

#: The header the page's script sends with a confirmed forget.
CONFIRM_HEADER: Final = "X-Idemkey-Confirm"
_DIGEST: Final = re.compile(r"^[0-9a-f]{32}$")

# Forget a record unless a live claim holds it (in progress, its lease not lapsed): atomic, so
# a retry that claimed the record since the page was drawn is never deleted under it.
# KEYS[1] record hash, the only key (the lease is its field "lease", a deadline on the
# server's clock, Unix ms; a claim written by 0.2 keeps it in KEYS[1] .. ":lock", read with
# pcall: remove in 0.4). Reply: keys deleted, or -1 when a live claim holds it.
_FORGET_UNLESS_HELD: Final = """
local record = redis.call("HMGET", KEYS[1], "state", "lease")
if record[1] == "in_progress" then
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local time = redis.call("TIME")
  local deadline = tonumber(record[2])
  if not deadline then
    local left = redis.pcall("PTTL", KEYS[1] .. ":lock")
    if type(left) ~= "number" or left ~= -2 then
      return -1
    end
  elseif deadline > time[1] * 1000 + math.floor(time[2] / 1000) then
    return -1
  end
end
return redis.call("DEL", KEYS[1])
"""


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def create_app(store: RedisStore, *, refresh: float = 3.0, allow_forget: bool = False) -> Starlette:
    """The console for the records under ``store``'s prefix, refreshed every ``refresh`` s."""
    templates = Environment(
        loader=PackageLoader("idemkey.console", "templates"),
        autoescape=select_autoescape(["html"]),
    )
    templates.filters["secs"] = compact_seconds
    templates.filters["when"] = _when
    forget_script = store.client.register_script(_FORGET_UNLESS_HELD)

    def render(name: str, **context: Any) -> str:
        return templates.get_template(name).render(
            allow_forget=allow_forget, max_listed=MAX_LISTED, **context
        )

    def view() -> tuple[Any, str]:
        try:
            return snapshot(store), ""
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
            refresh_ms=int(refresh * 1000),
            prefix=store.policy.prefix,
        )
        return HTMLResponse(html, headers=_headers(nonce))

    def fragment(request: Request) -> Response:
        shot, error = view()
        html = render("view.html", shot=shot, error=error)
        return HTMLResponse(html, status_code=503 if error else 200, headers=_headers(None))

    def status(request: Request) -> Response:
        shot, error = view()
        if shot is None:
            return JSONResponse({"error": error}, status_code=503, headers=_headers(None))
        return JSONResponse(shot.as_dict(), headers=_headers(None))

    async def forget(request: Request) -> Response:
        if not allow_forget:
            return _refused(403, "forget is off: start the console with --allow-forget")
        if request.headers.get(CONFIRM_HEADER) != "forget":
            return _refused(400, f"a forget needs the page's confirmation ({CONFIRM_HEADER})")
        origin = request.headers.get("origin")
        if origin is None or origin.rstrip("/") != str(request.base_url).rstrip("/"):
            return _refused(403, "a forget must come from the console's own page")
        try:
            body = await request.json()
        except ValueError:
            return _refused(400, 'the body must be JSON: {"digest": "<32 hex digits>"}')
        digest = body.get("digest") if isinstance(body, dict) else None
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            return _refused(400, "digest must be the record's 32 hex digits")
        name = f"{store.policy.prefix}:{{{digest}}}"
        try:
            deleted = forget_script(keys=[name])
        except Exception as exc:  # Redis failed: an answer, never a traceback
            return _refused(503, f"Redis failed: {type(exc).__name__}: {exc}")
        if deleted == -1:
            return _refused(409, "a live claim holds this record now; nothing deleted")
        return JSONResponse({"record": name, "deleted": int(deleted)}, headers=_headers(None))

    routes = [
        Route("/", page),
        Route("/fragment", fragment),
        Route("/api/status", status),
        Route("/api/forget", forget, methods=["POST"]),
    ]
    return Starlette(routes=routes)


def _refused(status: int, detail: str) -> Response:
    """An RFC 9457 problem."""
    return JSONResponse(
        {"type": "about:blank", "title": "refused", "status": status, "detail": detail},
        status_code=status,
        media_type="application/problem+json",
        headers=_headers(None),
    )


def _headers(nonce: str | None) -> dict[str, str]:
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
