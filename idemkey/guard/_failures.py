"""Remembered failures (``cache_exceptions=``), without I/O: which exceptions are remembered,
how one is stored, and how it is raised again.

A declared exception is deterministic (a card declined, a validation error): running the work
again gives the same answer, so the first answer is stored in the record as the result and
every retry raises it again without running. It is stored as data, never pickled: the class's
import path, ``str(exc)`` and the fields declared for it, all MessagePack, behind their own
format byte (:data:`FAILURE_FORMAT`), so no stored value can be mistaken for one.

Raised again, the exception is an instance of the same class whose ``args`` is the message
and whose declared fields are set as attributes; its ``__init__`` is not called (it may need
arguments the record does not hold). A class that cannot be imported any more, or is no longer
an exception, is raised as :class:`~idemkey.errors.StoredFailureError` naming it.
"""

from __future__ import annotations

import importlib
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


class StoredFailure(msgspec.Struct, frozen=True, array_like=True):
    """A remembered exception as stored: ``module:qualname``, ``str(exc)``, declared fields."""

    type: str
    message: str
    fields: dict[str, Any] = {}


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
        is released as for any other exception)."""
        if not isinstance(exc, self.types) or isinstance(exc, IdemkeyError):
            return None
        names: dict[str, None] = {}
        for cls, fields in self._fields.items():
            if isinstance(exc, cls):
                names.update(dict.fromkeys(fields))
        try:
            values = {name: getattr(exc, name) for name in names if hasattr(exc, name)}
            stored = StoredFailure(_type_path(type(exc)), str(exc), values)
            return _FAILURE_BYTE + _encoder.encode(stored)
        except Exception:  # an unencodable field, a __str__ that raises: not remembered
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
    for cls, fields in pairs:
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            raise ConfigurationError(f"cache_exceptions takes Exception subclasses, not {cls!r}")
        if issubclass(cls, IdemkeyError):
            raise ConfigurationError(f"idemkey's own errors are never remembered: {cls.__name__}")
        if "<locals>" in cls.__qualname__:
            raise ConfigurationError(
                f"{cls.__qualname__} is defined inside a function: a remembered failure is "
                "raised again by importing its class, so declare it at module level"
            )
        if isinstance(fields, str) or not all(isinstance(f, str) for f in fields):
            raise ConfigurationError(f"the fields of {cls.__name__} must be a tuple of names")
        declared[cls] = tuple(fields)
    return FailureRules(declared)


def is_failure(stored: bytes) -> bool:
    """Whether a stored result is a remembered failure."""
    return stored[:1] == _FAILURE_BYTE


def read_failure(stored: bytes) -> StoredFailure:
    """A remembered failure as stored; :class:`RecordFormatError` when it is unreadable."""
    try:
        return _decoder.decode(memoryview(stored)[1:])
    except msgspec.DecodeError as exc:
        raise RecordFormatError(f"stored failure is unreadable: {exc}") from exc


def raise_failure(stored: bytes) -> BaseException:
    """The exception a remembered failure raises again (returned, for ``raise``)."""
    try:
        failure = read_failure(stored)
    except RecordFormatError as exc:
        return exc
    module_name, _, qualname = failure.type.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError, ValueError) as exc:
        why = f"it cannot be imported ({type(exc).__name__}: {exc})"
        return StoredFailureError(failure.type, failure.message, failure.fields, why)
    if not (isinstance(found, type) and issubclass(found, Exception)):
        why = "it is no longer an Exception subclass"
        return StoredFailureError(failure.type, failure.message, failure.fields, why)
    try:
        error: Exception = found.__new__(found)
        error.args = (failure.message,)
        for name, value in failure.fields.items():
            setattr(error, name, value)
    except Exception as exc:  # a __new__ that needs arguments, a read-only field
        why = f"it cannot be rebuilt ({type(exc).__name__}: {exc})"
        return StoredFailureError(failure.type, failure.message, failure.fields, why)
    note = getattr(error, "add_note", None)
    if note is not None:  # Python 3.11+
        note("idemkey: raised again from the failure the first run stored (cache_exceptions)")
    return error
