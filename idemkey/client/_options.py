"""The client's options, converted and checked once, where they arrive (its constructors).

Each check raises :class:`~idemkey.errors.ConfigurationError` naming the field and where it
came from: ``IdempotentTransport(methods=...): expected a collection of method names, got the
string 'POST'``. A bare string where a collection belongs is refused, never split into letters.
"""

from __future__ import annotations

import inspect
import math
import reprlib
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, TypeVar

from .._options import TOKEN
from ..errors import ConfigurationError

__all__ = [
    "check_hook",
    "check_http_options",
    "check_instance",
    "count",
    "describe",
    "fraction",
    "header_name",
    "http_timeout",
    "invalid",
    "method_names",
    "refuse_unknown",
    "seconds",
    "status_codes",
]

T = TypeVar("T")

#: RFC 9110 5.6.2: a header name and a method are both tokens.


def describe(value: object) -> str:
    """``value`` as an error message shows it: ``the string 'POST'``, ``-1``, ``a list [...]``."""
    if isinstance(value, str):
        return f"the string {reprlib.repr(value)}"
    if isinstance(value, bytes):
        return f"the bytes {reprlib.repr(value)}"
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    if isinstance(value, type):
        return f"the class {value.__qualname__}"
    return f"{type(value).__name__} {reprlib.repr(value)}"


def invalid(where: str, field: str, expected: str, value: object) -> ConfigurationError:
    return ConfigurationError(f"{where}({field}=...): expected {expected}, got {describe(value)}")


def _number(value: object) -> float | None:
    """``value`` as a float if it is a real number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def seconds(where: str, field: str, value: object, *, positive: bool = False) -> float:
    """A finite duration in seconds, ``> 0`` if ``positive``, else ``>= 0``."""
    number = _number(value)
    if number is None or not math.isfinite(number) or number < 0 or (positive and number == 0):
        expected = "finite seconds > 0" if positive else "finite seconds >= 0"
        raise invalid(where, field, expected, value)
    return number


def count(where: str, field: str, value: object, *, least: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise invalid(where, field, f"a whole number >= {least}", value)
    return value


def fraction(where: str, field: str, value: object) -> float:
    number = _number(value)
    if number is None or not 0 <= number <= 1:
        raise invalid(where, field, "a fraction between 0 and 1", value)
    return number


def _collection(where: str, field: str, value: object, expected: str) -> Iterable[object]:
    if isinstance(value, str | bytes) or not isinstance(value, Collection):
        raise invalid(where, field, expected, value)
    return value


def method_names(where: str, field: str, value: object) -> frozenset[str]:
    """A collection of HTTP method names, upper-cased: ``["post"]`` is ``{"POST"}``."""
    expected = "a collection of method names"
    names = list(_collection(where, field, value, expected))
    if not names:
        raise invalid(where, field, f"{expected} (at least one)", value)
    for name in names:
        if not isinstance(name, str) or not TOKEN.fullmatch(name):
            raise invalid(where, field, f"{expected}, each a token such as 'POST'", value)
    return frozenset(str(name).upper() for name in names)


def status_codes(where: str, field: str, value: object) -> frozenset[int]:
    expected = "a collection of HTTP status codes"
    codes = []
    for code in _collection(where, field, value, expected):
        if not isinstance(code, int) or isinstance(code, bool) or not 100 <= code <= 599:
            raise invalid(where, field, f"{expected}, each an int from 100 to 599", value)
        codes.append(code)
    return frozenset(codes)


def header_name(where: str, field: str, value: object) -> str:
    if not isinstance(value, str) or not TOKEN.fullmatch(value):
        raise invalid(where, field, "a header name such as 'Idempotency-Key'", value)
    return value


def check_instance(where: str, field: str, value: object, kind: type[T], expected: str) -> T:
    if not isinstance(value, kind):
        raise invalid(where, field, expected, value)
    return value


def check_hook(where: str, field: str, value: T) -> T:
    if value is not None and not callable(value):
        raise invalid(where, field, "a callable or None", value)
    return value


def refuse_unknown(where: str, unknown: Mapping[str, object], known: Iterable[str]) -> None:
    """Keywords a constructor does not take: one error naming them, and the ones it does."""
    if unknown:
        names = ", ".join(f"{name}=..." for name in sorted(unknown))
        raise ConfigurationError(
            f"{where}({names}): not an option; the options are {', '.join(known)}"
        )


def check_http_options(
    where: str, factory: Callable[..., Any], options: Mapping[str, object]
) -> None:
    """Options for ``httpx.Client``/``httpx.AsyncClient``: known names, and a sane ``timeout``."""
    parameters = inspect.signature(factory).parameters
    known = [name for name, p in parameters.items() if p.kind is p.KEYWORD_ONLY]
    unknown = {name: value for name, value in options.items() if name not in known}
    if unknown:
        names = ", ".join(f"{name}=..." for name in sorted(unknown))
        raise ConfigurationError(
            f"{where}({names}): not an option of {where} nor of httpx.{factory.__name__}"
        )
    if "timeout" in options:
        http_timeout(where, "timeout", options["timeout"])


def http_timeout(where: str, field: str, value: T) -> T:
    """An httpx timeout: seconds ``>= 0``, None, a tuple of them or an ``httpx.Timeout``.

    The same check for ``Client(timeout=...)`` and ``client.prepare(timeout=...)``: httpx
    itself lets -1 through to the first read (or to a connect that fails on every attempt),
    and ``nan`` to a ValueError there.
    """
    import httpx  # here, so that the sans-IO schedule that imports this module needs none

    if value is None or value is httpx.USE_CLIENT_DEFAULT:
        return value
    expected = "seconds >= 0, None or an httpx.Timeout"
    try:
        parts = httpx.Timeout(value).as_dict()  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise invalid(where, field, expected, value) from None
    for part in parts.values():
        number = _number(part)
        if part is not None and (number is None or not number >= 0):
            raise invalid(where, field, expected, value)
    return value
