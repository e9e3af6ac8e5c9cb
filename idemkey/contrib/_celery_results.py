"""How :class:`~idemkey.contrib.celery.IdempotentTask` stores a task's result: as Celery's own
JSON (kombu's) writes it, so that a duplicate returns what the first caller got.

Celery's JSON carries ``datetime``, ``date``, ``time``, ``Decimal``, ``UUID`` and ``bytes`` as
themselves (kombu's type registry: ``{"__type__": ..., "__value__": ...}``), where msgspec
stores them as text and an untyped decode gives that text back. A result that is plain JSON
(dicts with str keys, lists, str, bool, None, numbers msgpack holds) is stored as that msgspec
value, as 0.3 stored every result and reads it back; any other is stored as kombu's JSON text,
in a msgpack extension value (:data:`KOMBU_JSON`) that no earlier record holds (Celery's JSON
carries no extension value, so no task could have returned one). 0.3 cannot read that form.

A stored result is input. Decoding it runs kombu's ``loads``, whose hook only looks a
``__type__`` up among the decoders registered with kombu (by kombu itself: the data types above;
by the application, if it registers more, as Celery's result backend then decodes them too):
the stored text names no module and imports nothing. Never pickle, whatever the task's
serializer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec
from kombu import serialization
from kombu.utils import json as kombu_json

from ..errors import RecordFormatError

__all__ = ["KOMBU_JSON", "Unkept", "as_stored", "from_stored"]

#: The msgpack extension code of a result stored as kombu JSON text ("J").
KOMBU_JSON: Final = 74
# Celery's "json" serializer is these two functions (kombu.serialization.register_json).
_dumps: Final[Callable[[object], str]] = kombu_json.dumps
_loads: Final[Callable[[str | bytes], Any]] = kombu_json.loads
# The registry of every result serializer (Celery's result_serializer names one of them).
_serialize: Final[Callable[..., tuple[str, str, Any]]] = serialization.dumps
_deserialize: Final[Callable[..., Any]] = serialization.loads


class Unkept(Exception):
    """The result cannot be stored so that a duplicate gets it back equal; says why."""


def _as_served(value: object, serializer: str) -> object:
    """What the result ``serializer`` hands the caller for ``value`` (msgpack and yaml a list
    for a tuple; pickle the object itself); ``value`` when it cannot say (an unknown or
    uninstalled serializer, a value it cannot carry: Celery's backend reports that)."""
    try:
        content_type, encoding, data = _serialize(value, serializer=serializer)
        return _deserialize(data, content_type, encoding, accept=[content_type])
    except Exception:  # a serializer may raise anything
        return value


def _plain(value: object) -> bool:
    """Whether ``value`` (as kombu's JSON gave it back) is made only of what msgspec stores and
    an untyped decode returns as itself: the form 0.3 reads. Exact types, no recursion."""
    todo = [value]
    while todo:
        item = todo.pop()
        if type(item) is dict:
            if any(type(k) is not str or not _encodable(k) for k in item):
                return False
            todo.extend(item.values())
        elif type(item) is list:
            todo.extend(item)
        elif type(item) is int:
            if not -(2**63) <= item < 2**64:
                return False
        elif type(item) is str:
            if not _encodable(item):
                return False
        elif type(item) not in (float, bool, type(None)):
            return False
    return True


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeError:  # a lone surrogate: msgpack cannot hold it
        return False
    return True


def as_stored(value: object, serializer: str) -> object:
    """``value`` as stored: the plain value when :func:`_plain` (0.3 reads it), else its kombu
    JSON. Under a result serializer other than ``json``, only a value JSON gives back equal to
    what that serializer hands the caller: under pickle (the object itself) a tuple, a set or an
    object would replay as something else; msgpack hands over a tuple as a list, as JSON does.
    Raises :class:`Unkept`."""
    try:
        text = _dumps(value)
    except Exception as exc:  # a __json__ method may raise anything
        raise Unkept(f"it is stored as Celery's JSON, which cannot carry it: {exc}") from exc
    if serializer != "json":
        try:
            same = bool(_loads(text) == _as_served(value, serializer))
        except Exception:  # the value's own __eq__ may raise anything
            same = False
        if not same:
            raise Unkept(
                f"the task's result_serializer is {serializer!r}, and stored as Celery's JSON "
                "it would not come back equal (a tuple, a set, an object); return what JSON "
                "carries (dicts, lists, str, numbers)"
            )
    try:
        served = _loads(text)
    except Exception:  # a value's JSON no decoder takes back: kept as text, as before
        pass
    else:
        if _plain(served):
            return served
    return msgspec.msgpack.Ext(KOMBU_JSON, text.encode())


def from_stored(stored: Any) -> Any:
    """The result a replay returns: the kombu JSON of :func:`as_stored` decoded, or a value an
    earlier release stored as it is. Raises :class:`~idemkey.RecordFormatError`."""
    if type(stored) is not msgspec.msgpack.Ext:
        return stored
    if stored.code != KOMBU_JSON:
        raise RecordFormatError(
            f"stored Celery result is unreadable: msgpack extension type {stored.code}"
        )
    try:
        return _loads(bytes(stored.data))
    except Exception as exc:  # a registered decoder may raise anything
        # Named by type only: kombu's messages quote the stored text, which may be anything.
        raise RecordFormatError(
            f"stored Celery result is unreadable: {type(exc).__name__} decoding its JSON"
        ) from None
