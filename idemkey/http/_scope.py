"""The default scope: a digest of every credential a request carries in its headers.

A header is a credential when its name is ``Authorization``, ``Proxy-Authorization`` or
``Cookie``, or reads as one: it contains one of :data:`CREDENTIAL_WORDS` (``X-Auth-Token``,
``Api-Key``, ``X-Session-Id``, ``X-Client-Secret``). Not credentials, whatever they contain: the
policy's own key header (``Idempotency-Key`` contains "key"), any ``*idempotency*`` header,
``Sec-WebSocket-Key``, and HTTP/2 pseudo-headers (``:authority``).

The scope runs on every keyed request, so the names are classified once per shape of request
(:data:`_FIELD_SHAPES`): a request costs a copy of its header names into a tuple and one dictionary
lookup, and one with no credential at all is not hashed (:data:`NO_CREDENTIALS`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import TYPE_CHECKING, Final, NamedTuple

if TYPE_CHECKING:
    from ._messages import Request

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
# they came): the credentials among them, as a _Plan; None for no credential at all. One table
# per spelling (field names, PEP 3333 environ keys) and key header. Clients send a few shapes
# each, but shapes come from clients: each table stays bounded in entries, and each entry in
# bytes (a kept shape keeps the client's names: at most _MAX_SHAPE_NAMES of them, and
# _MAX_SHAPE_CHARS characters in all; an environ's own keys count). A shape past a bound, or
# met once the table is full, is classified on every request; it gets the same scope.
_FIELD_SHAPES: dict[str, dict[tuple[str, ...], _Plan | None]] = {}
_ENVIRON_SHAPES: dict[str, dict[tuple[str, ...], _Plan | None]] = {}
_MAX_SHAPES: Final = 1024
_MAX_SHAPE_NAMES: Final = 128
_MAX_SHAPE_CHARS: Final = 4096
_MAX_KEY_HEADERS: Final = 64
# One of _FIRST alone, with one value: its slot filled, the other two empty (the common case).
_ALONE: Final = (b"%d:%b;;;", b";%d:%b;;", b";;%d:%b;")


class _Plan(NamedTuple):
    """The credentials of one shape: ``first``, (slot, name) of each of _FIRST present;
    ``rest``, (name, the name length-prefixed) of every other, sorted by name."""

    first: tuple[tuple[int, str], ...]
    rest: tuple[tuple[str, bytes], ...]


def _digest(material: bytes) -> str:
    return hashlib.blake2b(material, digest_size=16).hexdigest()


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


def _plan(shape: tuple[str, ...], environ: bool, key_header: str) -> _Plan | None:
    """What the default scope digests of ``shape`` (see :data:`_FIELD_SHAPES`)."""
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
        return None
    first = tuple((slot, name) for slot, name in enumerate(_FIRST) if name in names)
    rest = sorted(names.difference(_FIRST))
    return _Plan(first, tuple((name, b"%d:%b" % (len(name), name.encode())) for name in rest))


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
    tables = _ENVIRON_SHAPES if environ else _FIELD_SHAPES
    shapes = tables.get(key_header)
    if shapes is None:
        shapes = tables.setdefault(key_header, {}) if len(tables) < _MAX_KEY_HEADERS else {}
    # The names in one tuple (a copy in C), looked up at once: a known shape costs no Python
    # step per header.
    shape = tuple(headers.raw_names())
    try:
        plan = shapes[shape]
    except KeyError:
        plan = _plan(shape, environ, key_header)
        # Sized on a miss only: a known shape costs nothing more.
        if (
            len(shapes) < _MAX_SHAPES
            and len(shape) <= _MAX_SHAPE_NAMES
            and sum(map(len, shape)) <= _MAX_SHAPE_CHARS
        ):
            shapes[shape] = plan
    if plan is None:
        return NO_CREDENTIALS
    lookup = headers.get_all
    first, rest = plan
    # The common cases first: one credential, on one line.
    if len(first) == 1 and not rest:
        slot, name = first[0]
        values = lookup(name)
        if len(values) == 1:
            value = values[0]
            return _digest(_ALONE[slot] % (len(value), value.encode("latin-1", "replace")))
    elif len(rest) == 1 and not first:
        name, prefix = rest[0]
        values = lookup(name)
        if len(values) == 1:
            value = values[0]
            return _digest(
                b";;;%b1:%d:%b" % (prefix, len(value), value.encode("latin-1", "replace"))
            )
    # The first three each in its slot, as every release did (see _FIRST); then the rest.
    slots = [b";", b";", b";"]
    later: list[bytes] = []
    for slot, name in first:
        values = lookup(name)
        if values:
            value = values[0]
            slots[slot] = b"%d:%b;" % (len(value), value.encode("latin-1", "replace"))
            if len(values) > 1:  # a second Cookie line (ASGI) is a credential too
                later.append(_field(b"%d:%b" % (len(name), name.encode()), values[1:]))
    slots += [_field(prefix, lookup(name)) for name, prefix in rest]
    if later:
        slots.append(b"+")
        slots += later
    return _digest(b"".join(slots))


def _field(name: bytes, values: list[str]) -> bytes:
    """One header field for the digest: its length-prefixed name, then each value."""
    if len(values) == 1:
        value = values[0]
        return b"%b1:%d:%b" % (name, len(value), value.encode("latin-1", "replace"))
    encoded = [b"%d:%b" % (len(v), v.encode("latin-1", "replace")) for v in values]
    return b"%b%d:%b" % (name, len(values), b"".join(encoded))


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
