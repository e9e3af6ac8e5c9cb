"""How :class:`~idemkey.contrib.celery.IdempotentTask` stores a task's result: as Celery's own
JSON (kombu's) writes it, so that a duplicate returns what the first caller got.

Celery's JSON carries ``datetime``, ``date``, ``time``, ``Decimal``, ``UUID`` and ``bytes`` as
themselves (kombu's type registry: ``{"__type__": ..., "__value__": ...}``), where msgspec
stores them as text and an untyped decode gives that text back. So the result is stored as
kombu's JSON text, in a msgpack extension value (:data:`KOMBU_JSON`) that no earlier record
holds: records written before hold the msgspec value itself and replay as they did (Celery's
JSON carries no extension value, so no task could have returned one).

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


def as_stored(value: object, serializer: str) -> msgspec.msgpack.Ext:
    """``value`` as stored: its kombu JSON. Under a result serializer other than ``json``, only
    a value JSON gives back equal to what that serializer hands the caller: under pickle (the
    object itself) a tuple, a set or an object would replay as something else; msgpack hands
    over a tuple as a list, as JSON does. Raises :class:`Unkept`."""
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
