"""Remembered failures (``cache_exceptions=``), without I/O: which exceptions are remembered,
how one is stored, and how it is raised again.

A declared exception is deterministic (a card declined, a validation error): running the work
again gives the same answer, so the first answer is stored in the record as the result and
every retry raises it again without running. It is stored as data, never pickled: the declared
class's ``module:qualname``, ``str(exc)``, the fields declared for it and ``exc.args`` when
they are plain data (:func:`_kept_args`), all MessagePack, behind their own format byte
(:data:`FAILURE_FORMAT`), so no stored value can be mistaken for one.

Stored data is input: no stored byte selects code. A stored failure is raised again only as
one of the classes the guard (step, task) reading it declared, found by comparing the stored
``module:qualname`` with theirs, exactly; nothing is imported. The instance is made with the
declared class's ``__new__``, only the fields declared for that class are set, and its
``args`` are the stored ones (the message when none are stored, or when with them ``str()``
would not give the message); its ``__init__`` is not called (it may need arguments the record
does not hold). Anything else (a class not declared here, a field not declared for it, an
entry that does not decode, a reader that declared nothing) is raised as
:class:`~idemkey.errors.StoredFailureError` naming what was found.

An exception of a subclass of a declared class that is not itself declared is stored as the
nearest declared class in its MRO (its message and that class's fields): the retry raises the
class the guard declared, which the caller's ``except`` for it catches. Storing the subclass's
own path would let a retry build a class nobody declared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from ..errors import ConfigurationError, IdemkeyError, RecordFormatError, StoredFailureError

__all__ = [
    "FAILURE_FORMAT",
    "FailureRules",
    "StoredFailure",
    "is_failure",
    "raise_failure",
    "read_failure",
    "rules_for",
]

#: The format byte of a stored failure (format 1 is a value, 2 a compressed value).
FAILURE_FORMAT: Final = 3
_FAILURE_BYTE: Final = bytes([FAILURE_FORMAT])
#: How much of an unreadable entry a StoredFailureError shows.
_SHOWN_BYTES: Final = 40
#: How deep a remembered exception's args may nest (lists, dicts) and still be kept.
_ARGS_DEPTH: Final = 16


class StoredFailure(msgspec.Struct, frozen=True, array_like=True):
    """A remembered exception as stored: ``module:qualname``, ``str(exc)``, declared fields,
    and ``exc.args`` when kept (left out when not: then the array is the three items earlier
    versions wrote, and a trailing fourth is one they ignore)."""

    type: str
    message: str
    fields: dict[str, Any] = {}
    args: tuple[Any, ...] | None = None


_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(StoredFailure)


def _type_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


class FailureRules:
    """The exceptions one guard, step or task remembers, each with its declared fields."""

    __slots__ = ("_fields", "types")

    def __init__(self, declared: Mapping[type[Exception], tuple[str, ...]]) -> None:
        self._fields = dict(declared)
        #: The declared classes, for ``isinstance``.
        self.types: tuple[type[Exception], ...] = tuple(declared)

    def encode(self, exc: BaseException) -> bytes | None:
        """The stored form of ``exc`` when it is remembered; None when it is not declared, or
        its message or a declared field cannot be encoded (then it is not remembered: the key
        is released as for any other exception). Stored as the nearest declared class in
        ``type(exc).__mro__`` (itself when declared), with that class's fields."""
        if not isinstance(exc, self.types) or isinstance(exc, IdemkeyError):
            return None
        declared = self._fields
        # None only for a virtual subclass (an ABC's register()): not in the MRO, not stored.
        cls = next((c for c in type(exc).__mro__ if c in declared), None)
        if cls is None:
            return None
        try:
            values = {name: getattr(exc, name) for name in declared[cls] if hasattr(exc, name)}
            message = str(exc)
            entry: list[Any] = [_type_path(cls), message, values]
            args = _kept_args(exc.args, message)
            if args is not None:
                entry.append(args)
            return _FAILURE_BYTE + _encoder.encode(entry)
        except Exception:  # an unencodable field, a __str__ that raises: not remembered
            return None

    def declared(self, type_path: str) -> tuple[type[Exception], tuple[str, ...]] | None:
        """The declared class whose ``module:qualname`` is exactly ``type_path``, with its
        fields; None when no declared class has it."""
        for cls, fields in self._fields.items():
            if _type_path(cls) == type_path:
                return cls, fields
        return None


def rules_for(cache_exceptions: object) -> FailureRules | None:
    """Check a ``cache_exceptions=`` argument: exception classes (an iterable), or a mapping
    from exception class to the names of the fields to store with it. None when empty."""
    if not cache_exceptions:
        return None
    if isinstance(cache_exceptions, type):
        cache_exceptions = (cache_exceptions,)
    if isinstance(cache_exceptions, Mapping):
        pairs = list(cache_exceptions.items())
    elif isinstance(cache_exceptions, Iterable) and not isinstance(cache_exceptions, str):
        pairs = [(cls, ()) for cls in cache_exceptions]
    else:
        raise ConfigurationError(
            "cache_exceptions takes exception classes, or a mapping of exception class to "
            f"field names; got {type(cache_exceptions).__name__}"
        )
    declared: dict[type[Exception], tuple[str, ...]] = {}
    paths: dict[str, type] = {}
    for cls, fields in pairs:
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            raise ConfigurationError(f"cache_exceptions takes Exception subclasses, not {cls!r}")
        if issubclass(cls, IdemkeyError):
            raise ConfigurationError(f"idemkey's own errors are never remembered: {cls.__name__}")
        if "<locals>" in cls.__qualname__:
            raise ConfigurationError(
                f"{cls.__qualname__} is defined inside a function: a remembered failure is "
                "matched by its class's module:qualname, which must name one class, so "
                "declare it at module level"
            )
        path = _type_path(cls)
        if paths.setdefault(path, cls) is not cls:
            raise ConfigurationError(f"two declared classes are both named {path}")
        # None or 5 for the fields was an untyped TypeError here.
        names = (
            tuple(fields)
            if isinstance(fields, Iterable) and not isinstance(fields, (str, bytes))
            else None
        )
        if names is None or not all(_field_name(f) for f in names):
            raise ConfigurationError(
                f"the fields of {cls.__name__} must be a tuple of attribute names "
                f"(identifiers, not __dunder__ names), got {fields!r:.60}"
            )
        declared[cls] = names
    return FailureRules(declared)


def _kept_args(args: tuple[Any, ...], message: str) -> list[Any] | None:
    """``args`` to store, when msgspec gives them back as they are and they are not just the
    message; else None (a retry's args are then ``(message,)``)."""
    # Plain first: comparing other objects runs their own __eq__.
    if not all(_plain(value, _ARGS_DEPTH) for value in args) or args == (message,):
        return None
    return list(args)


def _plain(value: object, depth: int) -> bool:
    # Exact built-in types only: a tuple, a Decimal, an Enum or a str subclass would come
    # back from MessagePack as another type, and deeper nesting than a reader decodes would
    # make the whole failure unreadable.
    kind = type(value)
    if isinstance(value, int) and kind is int:
        return -(2**63) <= value < 2**64  # MessagePack's integers
    if isinstance(value, list) and kind is list:
        return depth > 0 and all(_plain(item, depth - 1) for item in value)
    if isinstance(value, dict) and kind is dict:
        return depth > 0 and all(
            type(key) is str and _plain(item, depth - 1) for key, item in value.items()
        )
    return kind in (str, float, bool, bytes, type(None))


def _field_name(name: object) -> bool:
    return isinstance(name, str) and name.isidentifier() and not name.startswith("__")


def is_failure(stored: bytes) -> bool:
    """Whether a stored result is a remembered failure."""
    return stored[:1] == _FAILURE_BYTE


def read_failure(stored: bytes) -> StoredFailure:
    """A remembered failure as stored (for display too: it builds nothing, the type is a
    string); :class:`RecordFormatError` when it is unreadable."""
    try:
        return _decoder.decode(memoryview(stored)[1:])
    except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise RecordFormatError(f"stored failure is unreadable: {exc}") from exc


def raise_failure(stored: bytes, rules: FailureRules | None) -> BaseException:
    """The exception a remembered failure raises again (returned, for ``raise``): an instance
    of the class ``rules`` declares under the stored ``module:qualname``, with only its
    declared fields; else a :class:`StoredFailureError` naming what was found."""
    try:
        failure = read_failure(stored)
    except RecordFormatError as exc:
        shown = bytes(stored[:_SHOWN_BYTES])
        more = "..." if len(stored) > _SHOWN_BYTES else ""
        why = f"it does not decode ({exc.__cause__}; found {shown!r}{more})"
        return StoredFailureError("", "", {}, why)
    found = rules.declared(failure.type) if rules is not None else None
    if found is None:
        names = ", ".join(_type_path(c) for c in rules.types) if rules is not None else ""
        why = (
            f"it is not one of the classes declared here ({names})"
            if names
            else "nothing here declares cache_exceptions"
        )
        return StoredFailureError(failure.type, failure.message, failure.fields, why)
    cls, declared = found
    unknown = sorted(set(failure.fields).difference(declared))
    if unknown:
        why = f"{', '.join(map(repr, unknown))} not declared as fields of {cls.__qualname__}"
        return StoredFailureError(failure.type, failure.message, failure.fields, why)
    try:
        error: Exception = cls.__new__(cls)
        error.args = (failure.message,)
        for name, value in failure.fields.items():
            setattr(error, name, value)
    except Exception as exc:  # a __new__ that needs arguments, a read-only field
        why = f"it cannot be rebuilt ({type(exc).__name__}: {exc})"
        return StoredFailureError(failure.type, failure.message, failure.fields, why)
    if failure.args is not None:
        error.args = failure.args
        # An OSError's str() reads errno and strerror, which only its __init__ sets from args:
        # where the args would change the message, the message wins, as before args were kept.
        if _shown(error) != failure.message:
            error.args = (failure.message,)
    note = getattr(error, "add_note", None)
    if note is not None:  # Python 3.11+
        note("idemkey: raised again from the failure the first run stored (cache_exceptions)")
    return error


def _shown(error: BaseException) -> str | None:
    try:
        return str(error)
    except Exception:  # the declared class's own __str__, on an instance __init__ never saw
        return None
