"""Policy options, typed, checked and frozen at one boundary, whichever way they arrive.

Every path an option takes goes through :func:`convert`, one converter per field:
``Policy(...)`` and ``replace``, Flask's ``IDEMKEY_*`` config and ``@idem.idempotent(...)``,
Django's ``IDEMKEY`` setting and ``@idempotent(...)``, ``route()``, FastAPI's and Starlette's
``idem.guard(...)``, and ``fake_store(...)``. So a bare string for a set, ``methods="POST"``
that would become ``{'P', 'O', 'S', 'T'}`` and guard nothing, a wrong type such as
``lease="30"``, an unknown name or a negative or non-finite duration fails loudly everywhere,
with a :class:`ConfigurationError` that names the option as its source spells it:
``IDEMKEY_METHODS (Flask config): expected a collection of method names, got the string
'POST'``.

Converted values are what ``Policy`` stores: durations as float, collections as frozensets
(methods upper case, header names lower case). Converting a converted value changes nothing.
"""

from __future__ import annotations

import difflib
import inspect
import math
import numbers
import re
import reprlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol, TypeVar, runtime_checkable

from .errors import ConfigurationError

_P = TypeVar("_P", bound="_Replaceable")


class _Replaceable(Protocol):
    """What :func:`derive` needs of a Policy: a protocol, so no import of policy at load."""

    def replace(self: _P, **changes: Any) -> _P: ...


__all__ = [
    "ALIASES",
    "MAX_SECONDS",
    "MIN_LEASE",
    "TOKEN",
    "Label",
    "convert",
    "derive",
    "freeze",
    "keyword",
    "policy_fields",
    "policy_options",
    "seconds",
    "unknown",
]

#: How a source spells an option in an error message, from the option's name:
#: ``"ttl"`` -> ``"IDEMKEY_TTL (Flask config)"``.
Label = Callable[[str], str]

#: Options that spell a Policy field another way (``required`` in the view decorators).
ALIASES: Final = {"required": "require_key"}


def keyword(call: str) -> Label:
    """The label of a keyword argument: ``keyword("@idem.idempotent")("methods")`` is
    ``"@idem.idempotent(methods=...)"``."""
    return lambda name: f"{call}({name}=...)"


_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60


def _got(value: object) -> str:
    if isinstance(value, str):
        return f"the string {_repr.repr(value)}"
    return f"{_repr.repr(value)} ({type(value).__name__})"


def _fail(label: str, expected: str, value: object) -> ConfigurationError:
    return ConfigurationError(f"{label}: expected {expected}, got {_got(value)}")


# ---- one converter per kind of value -------------------------------------------------------


#: The longest duration any option takes: 10 years. The scripts get durations in whole
#: milliseconds and add them up (a claim writes now + lease, a tombstone lives ttl + grace), and
#: Lua writes a number of 1e14 or more (3 170 years of milliseconds) as "1e+14", which PEXPIRE
#: and HSET refuse, after the claim's HSET already ran; 10 years stays far below, and below 2**53.
MAX_SECONDS: Final = 315_360_000.0
#: The shortest lease: the heartbeat renews a claim every lease/3, and each renewal needs a Redis
#: round trip and its thread or task scheduled in time. A 1 ms lease was never held, and one
#: key's work ran two or three times at once; the tests' shortest lease is 0.3 s.
MIN_LEASE: Final = 0.1


def seconds(value: object, label: str, *, positive: bool = True) -> float:
    """A duration: a finite number of seconds, > 0 (``positive``) or >= 0, as a float, at most
    :data:`MAX_SECONDS`."""
    minimum = "> 0" if positive else ">= 0"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _fail(label, f"a number of seconds {minimum}", value)
    try:
        duration = float(value)
    except OverflowError:  # an int or a Fraction past any float
        duration = -1.0 if value < 0 else math.nextafter(MAX_SECONDS, math.inf)
    if not math.isfinite(duration) or duration < 0 or (positive and duration == 0):
        raise _fail(label, f"a finite number of seconds {minimum}", value)
    if duration > MAX_SECONDS:
        raise _fail(label, f"at most {MAX_SECONDS:.0f} seconds (10 years)", value)
    return duration


def _at_least_zero(value: object, label: str) -> float:
    return seconds(value, label, positive=False)


def _lease(value: object, label: str) -> float:
    lease = seconds(value, label)
    if lease < MIN_LEASE:
        raise _fail(
            label,
            f"at least {MIN_LEASE:g} seconds (the heartbeat renews a claim every lease/3, each "
            "renewal a Redis round trip)",
            value,
        )
    return lease


def _size(value: object, label: str) -> int:
    if isinstance(value, float) and value.is_integer():  # 1e6 is a whole number of bytes
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(label, "a size in bytes (an int >= 0)", value)
    return value


def _flag(value: object, label: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(label, "True or False", value)
    return value


def _collection(value: object, label: str, what: str) -> frozenset[Any]:
    """``value`` as a frozenset, refusing a bare string (``"POST"`` is not ``{"P", "O", ...}``)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise _fail(label, f"a collection of {what}", value)
    try:
        return frozenset(value)
    except TypeError:  # an unhashable item
        raise _fail(label, f"a collection of {what}", value) from None


#: An RFC 9110 token, what a header name and a method are: a name with a space, a colon or a
#: line break is one no request carries (a key header that never matches runs every retry) and
#: one no server may send.
TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def _names(
    what: str, case: Callable[[str], str], empty: bool = True
) -> Callable[[object, str], frozenset[str]]:
    """A collection of tokens (``what``), put in ``case``; ``empty``: none is a valid answer."""

    def convert(value: object, label: str) -> frozenset[str]:
        names = _collection(value, label, what)
        if not names and not empty:
            raise _fail(label, f"a collection of {what} (at least one)", value)
        for name in names:
            if not isinstance(name, str) or not TOKEN.fullmatch(name):
                raise ConfigurationError(
                    f"{label}: expected a collection of {what}, one of them is {_got(name)}; "
                    "each is an RFC 9110 token (letters, digits and !#$%&'*+-.^_`|~)"
                )
        return frozenset(case(name) for name in names)

    return convert


def _statuses(value: object, label: str) -> frozenset[int]:
    statuses = _collection(value, label, "HTTP status codes")
    for status in statuses:
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ConfigurationError(
                f"{label}: expected a collection of HTTP status codes (ints 100-599), "
                f"one of them is {_got(status)}"
            )
    return statuses


def _optional(convert: Callable[[object, str], Any]) -> Callable[[object, str], Any]:
    return lambda value, label: None if value is None else convert(value, label)


def _one_of(*choices: object) -> Callable[[object, str], Any]:
    def convert(value: object, label: str) -> object:
        for choice in choices:
            if type(value) is type(choice) and value == choice:
                return value
        raise _fail(label, " or ".join(repr(choice) for choice in choices), value)

    return convert


def _function(value: object, label: str) -> object:
    if not callable(value):
        raise _fail(label, "a callable", value)
    if inspect.iscoroutinefunction(value) or inspect.iscoroutinefunction(
        getattr(value, "__call__", None)  # noqa: B004  an instance whose __call__ is async
    ):
        # Called synchronously: an async hook's coroutine was never awaited, every event lost.
        raise _fail(label, "a plain (not async) callable; schedule async work yourself", value)
    return value


def _fingerprint(value: object, label: str) -> object:
    if callable(value) or value in ("bytes", "json"):
        return value
    raise _fail(label, "'bytes', 'json' or a callable (request, body) -> bytes | str", value)


def _header(value: object, label: str) -> str:
    if not isinstance(value, str) or not TOKEN.fullmatch(value):
        raise _fail(label, "a header name (an RFC 9110 token, such as 'Idempotency-Key')", value)
    return value


def _prefix(value: object, label: str) -> str:
    if not isinstance(value, str) or not value or "{" in value or "}" in value:
        raise _fail(label, "a non-empty string with no '{' or '}'", value)
    try:
        value.encode()  # a lone surrogate (os.environ's for a non-UTF-8 byte): Redis never sees it
    except UnicodeEncodeError:
        raise _fail(label, "a string UTF-8 can encode", value) from None
    return value


def _compress(value: object, label: str) -> object:
    if value is None or isinstance(value, bool):
        return value
    if not isinstance(value, int) or value < 0:
        raise _fail(label, "True, False, None or a size in bytes (an int >= 0)", value)
    return value


@runtime_checkable
class _Durability(Protocol):
    """What the store reads of ``Policy.durability`` (``policy.Replicas`` is the one made so):
    a protocol here, so this module, which ``policy`` imports, imports nothing of it."""

    count: int
    timeout_ms: int


def _durability(value: object, label: str) -> object:
    if value is not None and not isinstance(value, _Durability):
        raise _fail(label, "a Replicas(count, timeout) or None", value)
    return value


#: Policy field -> its converter. A field missing here is stored as given (a test requires
#: every field to have one: ``tests/unit/test_options.py``).
_CONVERTERS: Final[dict[str, Callable[[object, str], Any]]] = {
    "ttl": seconds,
    "lease": _lease,
    "wait": _at_least_zero,
    "methods": _names("method names", str.upper, empty=False),
    "require_key": _flag,
    "strict_header": _flag,
    "header": _header,
    "max_request_bytes": _size,
    "max_response_bytes": _size,
    "on_store_error": _one_of("closed", "open"),
    "store_error_retry_after": _at_least_zero,
    "prefix": _prefix,
    "scope": _function,
    "fingerprint": _fingerprint,
    "mismatch_status": _one_of(400, 409, 422),
    "store_server_errors": _flag,
    "release_statuses": _statuses,
    "header_denylist": _names("header names", str.lower),
    "header_allowlist": _optional(_names("header names", str.lower)),
    "durability": _durability,
    "compress": _compress,
    "on_event": _optional(_function),
    "render_problem": _optional(_function),
    "retention_header": _optional(_header),
    "mark_first_responses": _flag,
    "expired_grace": _at_least_zero,
    "keep_keys": _flag,
    "keep_key_after_completion": _flag,
    "mark_retryable": _flag,
}


def convert(name: str, value: object, label: str) -> Any:
    """Field ``name``'s ``value`` typed, checked and frozen; ``label`` names it in errors."""
    converter = _CONVERTERS.get(name)
    return value if converter is None else converter(value, label)


# ---- the boundary every path crosses ------------------------------------------------------

_POLICY_LABEL: Final = keyword("Policy")


#: Policy's fields: one converter each (tests/unit/test_options.py holds them equal).
_FIELDS: Final = tuple(_CONVERTERS)


def unknown(name: str, label: Label, aliases: bool = True) -> ConfigurationError:
    """The error for an option that is no Policy field, with the nearest one if one is."""
    names = (*_FIELDS, *ALIASES) if aliases else _FIELDS
    near = difflib.get_close_matches(name.lower(), names, n=1)
    hint = f"did you mean {label(near[0])}?" if near else f"the fields are {', '.join(names)}"
    return ConfigurationError(f"{label(name)}: not a Policy field; {hint}")


def policy_fields(options: Iterable[str], label: Label, aliases: bool = True) -> None:
    """Refuse a name in ``options`` that is no Policy field (nor, with ``aliases``, an alias
    of one)."""
    fields = _FIELDS
    for name in options:
        if (ALIASES.get(name, name) if aliases else name) not in fields:
            raise unknown(name, label, aliases)


def policy_options(options: Mapping[str, Any], label: Label) -> dict[str, Any]:
    """``options`` as Policy field changes: aliases resolved, each value converted, and an
    unknown name refused, every error naming the option by ``label``."""
    policy_fields(options, label)
    changes: dict[str, Any] = {}
    for spelled, value in options.items():
        name = ALIASES.get(spelled, spelled)
        changes[name] = convert(name, value, label(spelled))
    return changes


def derive(base: _P, changes: Mapping[str, Any], source: str) -> _P:
    """``base`` with ``changes`` (from :func:`policy_options`); an error between fields (a
    lease longer than the ttl) names ``source``."""
    if not changes:
        return base
    try:
        return base.replace(**changes)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{source}: {exc}") from None


def freeze(policy: object) -> None:
    """Convert every field of a Policy being built in place (its ``__post_init__``)."""
    for name, converter in _CONVERTERS.items():
        value = getattr(policy, name)
        converted = converter(value, _POLICY_LABEL(name))
        if converted is not value:
            object.__setattr__(policy, name, converted)
