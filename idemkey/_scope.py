"""The default scope: a digest of every credential a request carries in its headers.

A header is a credential when its name is ``Authorization``, ``Proxy-Authorization`` or
``Cookie``, or reads as one: it contains one of :data:`CREDENTIAL_WORDS` (``X-Auth-Token``,
``Api-Key``, ``X-Session-Id``, ``X-Client-Secret``). Not credentials, whatever they contain: the
policy's own key header (``Idempotency-Key`` contains "key"), any ``*idempotency*`` header,
``Sec-WebSocket-Key``, and HTTP/2 pseudo-headers (``:authority``).

The scope runs on every keyed request, so the names are classified once per shape of request
(:data:`_SHAPES`): a request costs a copy of its header names into a tuple and one dictionary
lookup, and one with no credential at all is not hashed (:data:`NO_CREDENTIALS`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from ._http_messages import Request

__all__ = ["CREDENTIAL_WORDS", "NO_CREDENTIALS", "credential_scope", "default_scope"]

#: A header whose lower-case name contains one of these is digested by the default scope.
CREDENTIAL_WORDS: Final = (
    "auth",
    "token",
    "key",
    "session",
    "secret",
    "cookie",
    "passw",
    "credential",
)
# Digested first, each in its own slot and in this order, as every release before this one
# did: a request that carries only these keeps the scope it had, so its records survive an
# upgrade. Every other credential follows, sorted by name.
_FIRST: Final = ("authorization", "x-api-key", "cookie")
# Ordinary headers that read as credentials: never digested.
_ORDINARY: Final = frozenset({"sec-websocket-key"})

# What the default scope digests of one shape of request (its raw header names, in the order
# they came): the credential names among them, as the (slots, rest) pair credential_scope
# walks. ``slots`` holds each of _FIRST, or "" where absent; ``rest`` the other credentials,
# sorted; (): no credential at all. One table per key header and spelling (field names, or
# PEP 3333 environ keys). Clients send a few shapes each, but shapes come from clients: each
# table stays bounded, and a shape past the bound is classified on every request.
_Found = tuple[tuple[str, str, str], tuple[str, ...]] | tuple[()]
_SHAPES: dict[tuple[bool, str], dict[tuple[str, ...], _Found]] = {}
_MAX_SHAPES: Final = 1024


def _digest(*parts: bytes) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


#: The default scope of a request that carries no credential: one scope that every such
#: request shares (the three empty slots of :data:`_FIRST`).
NO_CREDENTIALS: Final = _digest(b";;;")


def _credential_name(name: str) -> str:
    """``name`` in lower case when the default scope digests a header of that name, else ""."""
    low = name.lower()
    if low in _FIRST:
        return low
    if low[:1] == ":" or "idempotency" in low or low in _ORDINARY:
        return ""
    return low if any(word in low for word in CREDENTIAL_WORDS) else ""


def _found(shape: tuple[str, ...], environ: bool, key_header: str) -> _Found:
    """Which of ``shape``'s names the default scope digests (see :data:`_SHAPES`)."""
    key = key_header.lower()
    names: set[str] = set()
    for raw in shape:
        if environ:
            if raw[:5] != "HTTP_":
                continue  # CONTENT_TYPE, REQUEST_METHOD, wsgi.input: not credentials
            raw = raw[5:].replace("_", "-")
        name = _credential_name(raw)
        if name and name != key:  # a key header named like a credential is the key itself
            names.add(name)
    if not names:
        return ()
    first, second, third = (name if name in names else "" for name in _FIRST)
    return (first, second, third), tuple(sorted(names.difference(_FIRST)))


def credential_scope(request: Request, key_header: str = "Idempotency-Key") -> str:
    """Default scope: a digest of every credential header the request carries.

    ``Authorization``, ``Proxy-Authorization``, ``Cookie`` and every header whose name contains
    auth, token, key, session, secret, cookie, passw or credential, except ``key_header`` (the
    idempotency key itself) and ``*idempotency*``, ``Sec-WebSocket-Key`` and pseudo-headers.
    Each value is length-prefixed and the names are sorted, so the order headers arrive in
    does not matter and two different credentials never share a record. A request with none
    gets :data:`NO_CREDENTIALS`, one scope for all of them.

    It is a safe default, not a good one: a rotated token or a changed cookie starts a new
    scope, so a retry sent with it runs again. Set ``Policy(scope=...)`` to your tenant id.
    """
    headers = request.headers
    environ = headers.environ_keys
    shapes = _SHAPES.get((environ, key_header))
    if shapes is None:
        shapes = _SHAPES.setdefault((environ, key_header), {}) if len(_SHAPES) < 64 else {}
    # The names in one tuple (a copy in C), looked up at once: a known shape costs no Python
    # step per header.
    shape = tuple(headers.raw_names())
    found = shapes.get(shape)
    if found is None:
        found = _found(shape, environ, key_header)
        if len(shapes) < _MAX_SHAPES:
            shapes[shape] = found
    if not found:
        return NO_CREDENTIALS
    slots, rest = found
    lookup = headers.get_all
    parts: list[bytes] = []
    later: list[bytes] = []
    for name in slots:  # the first three, each in its slot, as before: see _FIRST
        values = lookup(name) if name else None
        if values:
            value = values[0]
            parts.append(b"%d:%s;" % (len(value), value.encode("latin-1", "replace")))
            if len(values) > 1:  # a second Cookie line (ASGI) is a credential too
                later.append(_field(name, values[1:]))
        else:
            parts.append(b";")
    for name in rest:
        parts.append(_field(name, lookup(name)))
    if later:
        parts.append(b"+")
        parts += later
    return hashlib.blake2b(b"".join(parts), digest_size=16).hexdigest()


def _field(name: str, values: list[str]) -> bytes:
    """One header field for the digest: its name and values, each length-prefixed."""
    return b"%d:%s%d:%s" % (
        len(name),
        name.encode("latin-1"),
        len(values),
        b"".join([b"%d:%s" % (len(v), v.encode("latin-1", "replace")) for v in values]),
    )


_logger = logging.getLogger("idemkey")
_warned = False
_warn_lock = threading.Lock()


def default_scope(request: Request, key_header: str) -> str:
    """:func:`credential_scope`, for a policy that set no scope: the first request that
    carries no credential it recognises logs a WARNING (once per process)."""
    scope = credential_scope(request, key_header)
    if scope is NO_CREDENTIALS and not _warned:
        _warn_once(request)
    return scope


def _warn_once(request: Request) -> None:
    global _warned
    with _warn_lock:
        if _warned:
            return
        _warned = True
    _logger.warning(
        "idemkey: a keyed %s request carried no credential header the default scope "
        "recognises (Authorization, Proxy-Authorization, Cookie, or a name containing %s): "
        "every such request shares one scope, so two clients that send the same key and body "
        "get one record. Set Policy(scope=...) to your tenant id (logged once per process)",
        request.method,
        ", ".join(CREDENTIAL_WORDS),
    )
