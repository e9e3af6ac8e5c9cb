"""What idemkey sees of an HTTP request and what it answers, without I/O.

The request view (:class:`Headers`, :class:`Request`), the answer an adapter sends as it is
(:class:`Response`), and the two ends of a guarded request (:class:`Complete`,
:class:`Release`). :mod:`idemkey.http` re-exports them: that is where users import them from.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import ClassVar, Final, TypeVar, overload

import msgspec

__all__ = [
    "Complete",
    "Headers",
    "Release",
    "Request",
    "Response",
    "content_length",
    "parse_content_length",
]

T = TypeVar("T")
_new_object = object.__new__


class Headers(Mapping[str, str]):
    """Case-insensitive, multi-valued request headers; ``headers[name]`` is the first value."""

    __slots__ = ("_values",)

    def __init__(self, items: Iterable[tuple[str, str]]) -> None:
        values: dict[str, list[str]] = {}
        for name, value in items:
            values.setdefault(name.lower(), []).append(value)
        self._values = values

    @classmethod
    def from_latin1(cls, items: Iterable[tuple[bytes, bytes]]) -> Headers:
        """Headers of raw ``(name, value)`` byte pairs (an ASGI scope's), decoded as latin-1:
        what ``Headers(decoded pairs)`` holds, without building the decoded list first."""
        values: dict[str, list[str]] = {}
        for name, value in items:
            values.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
        headers = _new_object(cls)
        headers._values = values
        return headers

    #: Whether :meth:`raw_names` are PEP 3333 environ keys (``HTTP_X_AUTH_TOKEN``) rather
    #: than lower-case field names.
    environ_keys: ClassVar[bool] = False

    def get_all(self, name: str) -> list[str]:
        """Every field line's value for ``name``, in order; every lookup goes through here."""
        return self._values.get(name.lower(), [])

    def raw_names(self) -> Iterable[str]:
        """The names as this view stores them, iterable at C speed (the default scope scans
        them on every request): lower-case field names, or environ keys (:attr:`environ_keys`)."""
        return self._values

    def __getitem__(self, name: str) -> str:
        values = self.get_all(name)
        if not values:
            raise KeyError(name)
        return values[0]

    @overload
    def get(self, name: str, /) -> str | None: ...
    @overload
    def get(self, name: str, /, default: str | T) -> str | T: ...
    def get(self, name: str, /, default: object = None) -> object:
        # Mapping.get would raise and catch KeyError for every absent header (about 1 us each;
        # the default scope looks up three that are usually absent).
        values = self.get_all(name)
        return values[0] if values else default

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and bool(self.get_all(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


# The four values below are frozen msgspec Structs, not frozen dataclasses: a Struct is built
# in C (about 0.1 us), a frozen dataclass through object.__setattr__ per field (about 0.9 us
# warm, and much more between network calls, caches cold), and every keyed request builds a
# Request and a Response or Complete. Immutable, compared and printed as dataclasses are;
# msgspec.structs.replace copies one with changes.


class Request(msgspec.Struct, frozen=True):
    """What idemkey sees of a request; ``Policy.scope`` receives it.

    ``route`` is the route template when the framework or the middleware's routes know it
    (Flask's ``/charges/<id>``), else empty: the record then uses the path, and events the
    fixed label :data:`idemkey.routes.ROUTE_UNKNOWN` (a concrete path is an unbounded label).
    ``query`` is the raw query string, without ``?``.
    """

    method: str
    path: str
    query: str
    headers: Headers
    route: str = ""


class Response(msgspec.Struct, frozen=True):
    """A complete answer an adapter sends as it is: status, headers (latin-1 text), body.

    ``reason``: the reason phrase to send (a replay's, as the first client got it); ``""``
    lets the adapter use the standard one.
    """

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    reason: str = ""


class Complete(msgspec.Struct, frozen=True):
    """Store this encoded response and complete the record."""

    stored: bytes


class Release(msgspec.Struct, frozen=True):
    """Free the key: the request never began (or failed), so a retry may run again."""

    reason: str


def content_length(headers: Headers) -> int | None:
    """The declared Content-Length, or None when absent or malformed."""
    values = headers.get_all("content-length")  # what .get would call
    return parse_content_length(values[0] if values else None)


def parse_content_length(value: str | None) -> int | None:
    """A Content-Length value as a number, or None when absent or malformed."""
    # ASCII digits inside optional spaces and tabs (RFC 9110 OWS), nothing else: isdigit()
    # accepts "³" (latin-1 0xB3) and strip() removes "\x1c", and int() refuses both.
    digits = value.strip(" \t") if value is not None else ""
    if not digits.isascii() or not digits.isdigit():
        return None
    try:
        return int(digits)
    except ValueError:  # past the digits int() converts (4 300 by default): a client's number
        return _long_length(digits)


#: What a Content-Length of more digits than int() converts reads as: past any body a request
#: or an answer carries (an exabyte), so past every limit.
_PAST_ANY_LENGTH: Final = 10**18


def _long_length(digits: str) -> int:
    """A length of many digits, leading zeros and all."""
    significant = digits.lstrip("0")
    return _PAST_ANY_LENGTH if len(significant) > 18 else int(significant or "0")
