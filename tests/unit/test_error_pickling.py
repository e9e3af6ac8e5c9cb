"""Every public idemkey error crosses a process boundary as itself.

Celery hands a task's exception to the caller in two ways, and both rebuild it from its
``args``: its worker checks that the exception pickles (pickle calls ``type(exc)(*exc.args)``)
and, when it does not, sends the nearest base class that does (the bare ``IdemkeyError``); its
JSON result backend (the default) stores ``args`` and calls ``type(exc)(*args)`` on the caller's
side. So each error keeps its constructor's arguments in ``args``, and a rebuilt one has the
same type, message and attributes. The classes are found, not listed, so a class added later
is held to it too (an ``__init__`` whose annotation has no sample here fails, asking for one).

The client's errors that hold an ``httpx.Response`` (or an ``IdempotentResponse``) cross whole
by pickle only: no JSON encodes a response, so Celery's JSON backend stores its repr in its
place; they rebuild from that with their fields and message, the response None
(tests/contrib/test_celery_client_errors.py).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import idemkey
import idemkey.errors
from idemkey.errors import IdemkeyError

MODULES = ["idemkey.errors", "idemkey", "idemkey.client"]


def _public_errors() -> Iterator[type[IdemkeyError]]:
    seen: set[type[IdemkeyError]] = set()
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional extra (httpx for the client) not installed
            continue
        for attribute, value in sorted(vars(module).items()):
            error = isinstance(value, type) and issubclass(value, IdemkeyError)
            if error and not attribute.startswith("_") and value not in seen:
                seen.add(value)
                yield value


def _response() -> Any:
    import httpx

    request = httpx.Request("POST", "https://api.example/charges")
    return httpx.Response(409, json={"code": "key_reused"}, request=request)


def _idempotent_response() -> Any:
    from idemkey.client import IdempotentResponse

    return IdempotentResponse(_response(), "key-1", 2)


#: A value for each constructor annotation, told apart by the parameter's position (so two
#: arguments swapped on the way back show).
SAMPLES: dict[str, Callable[[str, int], object]] = {
    "str": lambda name, at: f"{name}-{at}",
    "str | None": lambda name, at: f"{name}-{at}",
    "int": lambda name, at: 3 + at,
    "int | None": lambda name, at: 3 + at,
    "bool": lambda name, at: at % 2 == 1,  # neighbours differ: a swap shows
    "float": lambda name, at: 1.5 + at,
    "float | None": lambda name, at: 1.5 + at,
    "dict[str, object]": lambda name, at: {"code": "insufficient_funds", "amount": 51},
    "Mapping[str, object]": lambda name, at: {"detail": "reused", "retry": "never"},
    "httpx.Response": lambda name, at: _response(),
    "httpx.Response | None": lambda name, at: _response(),
    "IdempotentResponse": lambda name, at: _idempotent_response(),
    "IdempotentResponse | None": lambda name, at: _idempotent_response(),
}


def _init(cls: type[IdemkeyError]) -> Any:
    """The ``__init__`` that builds ``cls``; None when it is the built-in one (message only)."""
    init = next(c.__dict__["__init__"] for c in cls.__mro__ if "__init__" in c.__dict__)
    return init if inspect.isfunction(init) else None


def _instance(cls: type[IdemkeyError]) -> IdemkeyError:
    """``cls`` built with a sample for every parameter, defaults included."""
    init = _init(cls)
    if init is None:
        return cls(f"a {cls.__name__} message")
    arguments = []
    for at, parameter in enumerate(list(inspect.signature(init).parameters.values())[1:]):
        assert parameter.kind is parameter.POSITIONAL_OR_KEYWORD, (
            f"{cls.__name__}({parameter}): rebuilt as type(exc)(*exc.args), so positional"
        )
        sample = SAMPLES.get(str(parameter.annotation))
        assert sample is not None, f"add a sample for {parameter.annotation!r} ({cls.__name__})"
        arguments.append(sample(parameter.name, at))
    return cls(*arguments)


def _same(again: BaseException, error: BaseException) -> None:
    assert type(again) is type(error)
    assert str(again) == str(error)
    # repr: an httpx.Response has no __eq__, and one rebuilt is another object.
    assert repr(again.args) == repr(error.args)
    assert {k: repr(v) for k, v in vars(again).items()} == {
        k: repr(v) for k, v in vars(error).items()
    }


def _cases() -> Iterator[Any]:
    for cls in _public_errors():
        yield pytest.param(cls, id=cls.__name__)


def test_the_walk_finds_the_errors() -> None:
    found = set(_public_errors())
    exported = {getattr(idemkey.errors, name) for name in idemkey.errors.__all__}
    assert exported <= found
    assert idemkey.ResultNotStorableError in found


@pytest.mark.parametrize("cls", list(_cases()))
def test_every_public_error_pickles_and_rebuilds_from_its_args_as_itself(
    cls: type[IdemkeyError],
) -> None:
    error = _instance(cls)
    _same(pickle.loads(pickle.dumps(error)), error)
    # Celery's JSON result backend: type and args cross, then type(exc)(*args).
    _same(cls(*error.args), error)
    _same(copy.copy(error), error)
    _same(copy.deepcopy(error), error)
    # What a log line shows (Celery's "Retry in 1s: <repr>") is still the message.
    assert repr(error) == f"{cls.__name__}({str(error)!r})"


# ---- the client's errors: a response crosses as a plain copy, whether it pickles or not -------


def _cp1252(content: bytes) -> str:
    """A ``default_encoding`` function: it pickles by name, as a module's function does."""
    return "cp1252"


def _answer(status: int, headers: dict[str, str], content: bytes, *, pickles: bool) -> Any:
    """A read response, as a Client gives it (httpx copies the client's ``default_encoding``
    onto each response); with a lambda there, as ``Client(default_encoding=lambda c: ...)``
    leaves it, it does not pickle."""
    import httpx

    url = "https://user:SECRET@api.example/charges?account=7"
    credentials = {"Authorization": "Bearer SECRET", "Cookie": "session=SECRET"}
    request = httpx.Request("POST", url, headers={"X-Shard": "7", **credentials})
    encoding: Any = _cp1252 if pickles else (lambda content: "cp1252")
    response = httpx.Response(
        status, headers=headers, content=content, request=request, default_encoding=encoding
    )
    try:
        pickle.dumps(response)
    except Exception:
        pickled = False
    else:
        pickled = True
    assert pickled is pickles
    return response


PROBLEM = {
    "type": "urn:idemkey:problem:key_reused",
    "code": "key_reused",
    "detail": "Le paiement a déjà été fait",
    "retry": "new_key",
}


def _same_response(again: Any, response: Any) -> None:
    assert (again.status_code, again.headers.multi_items(), again.content) == (
        response.status_code,
        response.headers.multi_items(),
        response.content,
    )
    assert (again.text, again.encoding) == (response.text, response.encoding)
    # The request without the caller's credentials: pickle writes them where it stores.
    sent = response.request
    assert (again.request.method, again.request.url) == (
        sent.method,
        sent.url.copy_with(userinfo=b"", query=None),
    )
    kept = [(n, v) for n, v in sent.headers.multi_items() if n not in ("authorization", "cookie")]
    assert again.request.headers.multi_items() == kept
    assert ("x-shard", "7") in kept


@pytest.mark.parametrize("pickles", [True, False], ids=["response-pickles", "response-does-not"])
def test_a_refusal_crosses_with_what_its_caller_reads(pickles: bool) -> None:
    from idemkey.client import RefusedError

    headers = {"Content-Type": "application/problem+json", "Retry-After": "3"}
    response = _answer(422, headers, json.dumps(PROBLEM).encode(), pickles=pickles)
    error = RefusedError("key_reused", PROBLEM, response, 2)
    for again in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert isinstance(again, RefusedError)
        assert str(again) == str(error) == "422 key_reused: Le paiement a déjà été fait"
        assert (again.code, again.status, again.attempts, again.retry) == (
            "key_reused", 422, 2, "new_key"
        )  # fmt: skip
        assert again.problem == PROBLEM
        assert again.response.json() == PROBLEM
        _same_response(again.response, response)
        assert again.args[2] is again.response  # one response, as in the error raised
    assert b"SECRET" not in pickle.dumps(error)  # nor in what a result backend stores


@pytest.mark.parametrize("pickles", [True, False], ids=["response-pickles", "response-does-not"])
def test_giving_up_crosses_with_the_key_and_the_last_response(pickles: bool) -> None:
    """The text of a response whose charset a ``default_encoding`` function chose is still
    read in that charset (cp1252 here) on the other side."""
    import gzip

    from idemkey.client import RetriesExhaustedError

    # A body that came gzipped: the copy holds it decoded, its headers as they came.
    headers = {"Content-Type": "text/plain", "Content-Encoding": "gzip"}
    response = _answer(503, headers, gzip.compress("Ça déborde".encode("cp1252")), pickles=pickles)
    assert response.text == "Ça déborde"
    error = RetriesExhaustedError("attempts", "503", 3, response, "key-1")
    for again in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert isinstance(again, RetriesExhaustedError)
        assert str(again) == str(error)
        assert (again.reason, again.last, again.attempts, again.key) == (
            "attempts",
            "503",
            3,
            "key-1",
        )
        _same_response(again.response, response)
    none = RetriesExhaustedError("deadline", "timeout", 1, None, "key-2")
    assert pickle.loads(pickle.dumps(none)).response is None


@pytest.mark.parametrize("pickles", [True, False], ids=["response-pickles", "response-does-not"])
def test_an_unexpected_replay_crosses_with_its_reply(pickles: bool) -> None:
    from idemkey.client import IdempotentResponse, UnexpectedReplayError

    headers = {"Content-Type": "application/json", "Idempotent-Replayed": "true"}
    response = _answer(201, headers, b'{"id": "ch_1"}', pickles=pickles)
    error = UnexpectedReplayError(IdempotentResponse(response, "key-1", 2, after_lost=False))
    for again in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert isinstance(again, UnexpectedReplayError)
        assert str(again) == str(error)
        assert (again.key, again.attempts, again.reply.replayed, again.reply.after_lost) == (
            "key-1", 2, True, False
        )  # fmt: skip
        assert (again.reply.key, again.reply.attempts, again.reply.json()) == (
            "key-1", 2, {"id": "ch_1"}
        )  # fmt: skip
        _same_response(again.reply.response, response)


def test_an_unread_response_crosses_unread() -> None:
    """As httpx pickles an unread response: its head crosses, reading its body raises."""
    import httpx

    from idemkey.client import RetriesExhaustedError

    class Body(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            yield b"never read"

    request = httpx.Request("POST", "https://api.example/charges")
    response = httpx.Response(
        503,
        headers={"X-Shard": "7"},
        stream=Body(),
        request=request,
        default_encoding=lambda c: "utf-8",
    )
    again = pickle.loads(pickle.dumps(RetriesExhaustedError("attempts", "503", 2, response)))
    assert (again.response.status_code, again.response.headers["x-shard"]) == (503, "7")
    assert again.response.request.url == "https://api.example/charges"
    with pytest.raises(httpx.ResponseNotRead):
        again.response.content  # noqa: B018


def test_a_charset_the_caller_chose_crosses_with_the_response() -> None:
    """``response.encoding`` set over the header's charset (a server that mislabels its body)
    is how the caller reads ``.text``: the copy reads it the same way."""
    import httpx

    from idemkey.client import RefusedError

    sent = httpx.Request("POST", "https://api.example/charges")
    headers = {"Content-Type": "text/plain; charset=utf-8"}
    response = httpx.Response(409, headers=headers, content="héllo".encode("latin-1"), request=sent)
    response.encoding = "latin-1"
    error = RefusedError("in_flight", {}, response, 1)
    for again in (pickle.loads(pickle.dumps(error)), copy.copy(error)):
        assert (again.response.text, again.response.encoding) == ("héllo", "latin-1")
