"""The client's options, converted and checked once, where they arrive (its constructors).

Each check raises :class:`~idemkey.errors.ConfigurationError` naming the field and where it
came from: ``IdempotentTransport(methods=...): expected a collection of method names, got the
string 'POST'``. A bare string where a collection belongs is refused, never split into letters.
"""

from __future__ import annotations

import inspect
import math
import reprlib
import ssl
from collections.abc import Callable, Collection, Iterable, Mapping
from http.cookiejar import CookieJar
from typing import Any, TypeVar

from .._options import TOKEN
from .._options import _function as plain_function
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


def invalid(
    where: str, field: str, expected: str, value: object, *, secret: bool = False
) -> ConfigurationError:
    """The error for ``field``: a ``secret`` one's value (it may hold credentials) is named by
    its type only, since the message reaches logs and tracebacks."""
    got = _masked(value) if secret else describe(value)
    return ConfigurationError(f"{where}({field}=...): expected {expected}, got {got}")


def _masked(value: object) -> str:
    """``value`` as :func:`describe` shows it when it holds no text (a number, a class), else
    only its type: ``list``, not ``['payments', 's3cr3t']``."""
    if value is None or isinstance(value, bool | int | float | type):
        return describe(value)
    return f"{type(value).__name__} (not shown: it may hold credentials)"


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
    """A function the client calls synchronously, or None: never an async one, whose
    coroutine would never run (stop 53's check for ``on_event`` and ``render_problem``)."""
    if value is not None and not callable(value):
        raise invalid(where, field, "a callable or None", value)
    if value is not None:
        plain_function(value, f"{where}({field}=...)")
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
    """Options for ``httpx.Client``/``httpx.AsyncClient``: known names, each of a type httpx
    takes.

    httpx checks few: an ill-typed option was a TypeError, an AttributeError or an IndexError
    from deep inside its constructor (``headers=5``, ``limits="x"``), or was taken and failed
    at the first call (``transport=5``) or quietly (``max_redirects=-1``). Each is checked
    here as httpx reads it, by its own converters where it has them, rather than by building
    the client once more to see it fail: an httpx client loads the CA certificates (0.1 s).
    """
    import httpx

    parameters = inspect.signature(factory).parameters
    known = [name for name, p in parameters.items() if p.kind is p.KEYWORD_ONLY]
    unknown = {name: value for name, value in options.items() if name not in known}
    if unknown:
        names = ", ".join(f"{name}=..." for name in sorted(unknown))
        raise ConfigurationError(
            f"{where}({names}): not an option of {where} nor of httpx.{factory.__name__}"
        )
    asynchronous = isinstance(factory, type) and issubclass(factory, httpx.AsyncClient)
    transport = httpx.AsyncBaseTransport if asynchronous else httpx.BaseTransport
    for name, value in options.items():
        _http_option(where, name, value, transport)


#: The httpx options that are booleans.
_FLAGS = frozenset({"follow_redirects", "trust_env", "http1", "http2"})
#: The httpx options whose default is None: None is httpx's default, not a mistake.
_NONE_DEFAULT = frozenset(
    {"auth", "params", "headers", "cookies", "cert", "proxy", "mounts", "event_hooks", "transport"}
)


def _http_option(where: str, name: str, value: object, transport: type) -> None:
    """Refuse ``value`` for the httpx option ``name`` if httpx would fail on it, at once or at
    the first call; ``transport`` is the transport class the client takes."""
    import httpx

    if name == "timeout":
        http_timeout(where, name, value)
    elif value is None and name in _NONE_DEFAULT:
        return
    elif name in _FLAGS:
        check_instance(where, name, value, bool, "True or False")
    elif name == "max_redirects":
        count(where, name, value, least=0)
    elif name == "limits":
        check_instance(where, name, value, httpx.Limits, "an httpx.Limits")
    elif name == "transport":
        check_instance(where, name, value, transport, f"an httpx.{transport.__name__} or None")
    elif name == "mounts":
        if not isinstance(value, Mapping) or not all(
            isinstance(pattern, str) and (mounted is None or isinstance(mounted, transport))
            for pattern, mounted in value.items()
        ):
            expected = f"a mapping of URL patterns to an httpx.{transport.__name__} or None"
            raise invalid(where, name, expected, value)
    elif name == "auth":
        pair = (
            isinstance(value, tuple)
            and len(value) == 2
            and all(isinstance(part, str | bytes) for part in value)
        )
        if not (pair or isinstance(value, httpx.Auth) or callable(value)):
            expected = "an httpx.Auth, a (username, password) tuple or a callable"
            raise invalid(where, name, expected, value, secret=True)
    elif name == "event_hooks":
        if not isinstance(value, Mapping) or not all(
            kind in ("request", "response")
            and isinstance(hooks, list | tuple)
            and all(callable(hook) for hook in hooks)
            for kind, hooks in value.items()
        ):
            expected = "a mapping of 'request' and 'response' to lists of callables"
            raise invalid(where, name, expected, value)
    elif name == "verify":
        expected = "True, False, a CA bundle path or an ssl.SSLContext"
        if not isinstance(value, bool | str | ssl.SSLContext):
            raise invalid(where, name, expected, value)
    elif name == "cert":
        pair = isinstance(value, tuple) and 2 <= len(value) <= 3
        if not isinstance(value, str) and not pair:
            expected = "a certificate file or a (certfile, keyfile[, password]) tuple"
            raise invalid(where, name, expected, value, secret=True)
    elif name == "default_encoding":
        if not isinstance(value, str) and not callable(value):
            raise invalid(where, name, "an encoding name or a callable", value)
    elif name == "cookies":
        expected = "cookies (a dict, a list of pairs, httpx.Cookies or a CookieJar)"
        if not isinstance(value, dict | list | httpx.Cookies | CookieJar):
            raise invalid(where, name, expected, value, secret=True)
        _converted(where, name, value, httpx.Cookies, expected)
    elif name == "base_url":
        _converted(where, name, value, httpx.URL, "a URL (a str or an httpx.URL)")
    elif name == "headers":
        expected = "headers (a mapping or a list of pairs)"
        _converted(where, name, value, httpx.Headers, expected)
    elif name == "params":
        expected = "query parameters (a mapping, a list of pairs or a str)"
        _converted(where, name, value, httpx.QueryParams, expected)
    elif name == "proxy" and not isinstance(value, httpx.Proxy):
        expected = "a proxy URL (a str, an httpx.URL or an httpx.Proxy)"
        _converted(where, name, value, httpx.Proxy, expected)


def _converted(
    where: str, name: str, value: object, convert: Callable[[Any], object], expected: str
) -> None:
    """``value`` as httpx's ``convert`` reads it, or ConfigurationError naming the option (the
    error httpx raised is its cause). Every option converted so (a URL with a password, a
    query with a token, an Authorization header, a session cookie) may hold credentials: the
    message names the value's type, and a header's name, never a value."""
    import httpx

    try:
        convert(value)
    except (TypeError, ValueError, AttributeError, IndexError, httpx.InvalidURL) as exc:
        error = invalid(where, name, expected, value, secret=True)
        if name == "headers" and (header := _bad_header(value)):
            error = ConfigurationError(f"{error}; {header}")
        raise error from exc


def _bad_header(value: object) -> str | None:
    """Which item of ``headers`` httpx refuses, by its name and its value's type."""
    import httpx

    items = value.items() if isinstance(value, Mapping) else value
    if not isinstance(items, Iterable) or isinstance(items, str | bytes):
        return None
    for item in items:
        try:
            httpx.Headers([item])
        except (TypeError, ValueError, AttributeError, IndexError):
            pass
        else:
            continue
        if not isinstance(item, tuple | list) or len(item) != 2:
            return f"an item is {type(item).__name__}, not a (name, value) pair"
        header, content = item
        if not isinstance(header, str | bytes):
            return f"a header name is {type(header).__name__}"
        label = reprlib.repr(header if isinstance(header, str) else header.decode("latin-1"))
        return f"the header {label} has a value of type {type(content).__name__}"
    return None


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
    # IndexError: a tuple of fewer than four, which httpx reads by index.
    except (TypeError, ValueError, IndexError):
        raise invalid(where, field, expected, value) from None
    for part in parts.values():
        number = _number(part)
        if part is not None and (number is None or not number >= 0):
            raise invalid(where, field, expected, value)
    return value
