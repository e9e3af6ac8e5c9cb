"""Django: the middleware in settings.MIDDLEWARE, through Django's test Client (WSGI and ASGI)
and real servers (gunicorn for WSGI, uvicorn for ASGI Django), on the session's real Redis.

The project is tests/frameworks/djangoproject. Django's settings are global to the process
(and the adapter suite's Django harness configures them first), so in-process tests apply the
project's settings with ``override_settings``.
"""

from __future__ import annotations

import contextlib
import io
import json
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis

from idemkey import ConfigurationError, Event
from tests._servers import AppServer, wait_until
from tests.adapters.edge_servers import read_response

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "tests.frameworks.djangoproject"
JSON = "application/json"


def runs(client: redis.Redis, prefix: str, view: str) -> int:
    return int(client.get(f"{prefix}:runs:{view}") or 0)


@pytest.fixture
def project(redis_url: str, prefix: str, real_client: redis.Redis) -> Iterator[dict[str, Any]]:
    """The project's settings, applied for this test; yields the IDEMKEY dict to extend."""
    from django.test.utils import override_settings

    from tests.adapters.harness_wsgi import _django
    from tests.frameworks.djangoproject import settings as project_settings

    _django()  # configure Django once per process, the way the adapter suite does
    idemkey: dict[str, Any] = {"REDIS_URL": redis_url, "PREFIX": prefix, "LEASE": 10.0}
    with override_settings(
        ROOT_URLCONF=project_settings.ROOT_URLCONF,
        MIDDLEWARE=project_settings.MIDDLEWARE,
        ALLOWED_HOSTS=["*"],
        REDIS_URL=redis_url,
        IDEMKEY=idemkey,
    ):
        yield idemkey


def post(client: Any, path: str, key: str | None, body: object = None, **extra: str) -> Any:
    headers = {name.replace("_", "-"): value for name, value in extra.items()}
    if key is not None:
        headers["Idempotency-Key"] = key
    data = json.dumps(body if body is not None else {"amount": 5})
    return client.post(path, data=data, content_type=JSON, headers=headers)


def records(client: redis.Redis, prefix: str) -> list[bytes]:
    """The keys idemkey wrote under ``prefix`` (the views' run counters left out)."""
    return [k for k in client.scan_iter(match=f"{prefix}*") if b":runs:" not in k]


def test_a_decorated_view_is_guarded_through_the_test_client(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import Client

    client = Client()
    first = post(client, "/charges", "k1")
    again = post(client, "/charges", "k1")
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert runs(real_client, prefix, "charges") == 1
    reused = post(client, "/charges", "k1", {"amount": 6})
    assert reused.status_code == 422
    assert reused.headers["Content-Type"] == "application/problem+json"
    assert reused.json()["code"] == "key_reused"
    missing = post(client, "/charges", None)
    assert missing.status_code == 400
    assert missing.json()["code"] == "missing_key"
    assert runs(real_client, prefix, "charges") == 1


def test_a_custom_reason_phrase_is_replayed(project: dict[str, Any]) -> None:
    from django.test import Client

    client = Client()
    first = post(client, "/reasoned", "r1")
    again = post(client, "/reasoned", "r1")
    assert (first.status_code, first.reason_phrase) == (201, "Charged OK")
    assert again.headers["Idempotent-Replayed"] == "true"
    assert (again.status_code, again.reason_phrase) == (201, "Charged OK")


# ---- bodies the server cannot read -----------------------------------------------------------


class Upload(io.RawIOBase):
    """A server's ``wsgi.input``: ``parts``, one a read (as a dechunking reader returns them),
    then the end, or ``error`` raised (the server could not read the rest)."""

    def __init__(self, parts: list[bytes], error: Exception | None = None) -> None:
        self.parts, self.error = list(parts), error

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        if not self.parts:
            if self.error is not None:
                raise self.error
            return 0
        part = self.parts.pop(0)
        memoryview(buffer).cast("B")[: len(part)] = part
        return len(part)


class InvalidChunkSize(Exception):
    """What gunicorn raises for a malformed chunk size: not an OSError."""


#: A chunked request, as a WSGI server hands it over: no Content-Length, the stream ends it.
CHUNKED = {"CONTENT_LENGTH": "", "HTTP_TRANSFER_ENCODING": "chunked", "wsgi.input_terminated": True}

#: case -> (environ, the stream's parts, what it raises after them)
UNREADABLE = {
    "chunked-bad-chunk-size": (CHUNKED, [], InvalidChunkSize("Invalid chunk size: b'zz'")),
    "chunked-cut-off": (CHUNKED, [b'{"amount": 5'], OSError("Invalid chunk header")),
    "content-length-reset": ({}, [], ConnectionResetError(104, "Connection reset by peer")),
}


@pytest.mark.parametrize("case", UNREADABLE)
def test_a_body_the_server_cannot_read_is_400_invalid_body(
    project: dict[str, Any], real_client: redis.Redis, prefix: str, case: str
) -> None:
    """As the WSGI middleware answers it: never a 500, nothing claimed, the honest retry runs."""
    from django.test import Client

    environ, parts, error = UNREADABLE[case]
    client = Client()
    broken = client.post(
        "/charges", data=b'{"amount": 5}', content_type=JSON,
        headers={"Idempotency-Key": "u1"}, **{**environ, "wsgi.input": Upload(parts, error)},
    )  # fmt: skip
    assert broken.status_code == 400, broken.content
    assert broken.headers["Content-Type"] == "application/problem+json"
    assert broken.json()["code"] == "invalid_body"
    assert broken.json()["retry"] == "same_key"
    assert runs(real_client, prefix, "charges") == 0
    assert records(real_client, prefix) == []  # nothing claimed, nothing stored
    retry = post(client, "/charges", "u1")
    assert retry.status_code == 201
    assert runs(real_client, prefix, "charges") == 1


def test_a_chunked_body_is_read_to_its_end(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    """A dechunking reader returns a chunk a read: the view and the fingerprint get them all."""
    from django.test import Client

    def chunked(*parts: bytes) -> Any:
        return Client().post(
            "/charges", data=b"", content_type=JSON, headers={"Idempotency-Key": "c1"},
            **{**CHUNKED, "wsgi.input": Upload(list(parts))},
        )  # fmt: skip

    first = chunked(b'{"amount": 1', b"00}")
    assert first.status_code == 201, first.content
    assert first.json()["amount"] == 100
    other = chunked(b'{"amount": 1', b"99}")  # the same first chunk, another body
    assert other.status_code == 422
    assert other.json()["code"] == "key_reused"
    assert runs(real_client, prefix, "charges") == 1


def test_a_view_idemkey_does_not_guard_meets_djangos_own_error(project: dict[str, Any]) -> None:
    """idemkey reads a keyed body before it knows the view; a view it does not guard still
    gets the error Django gives without idemkey, not one of idemkey's making."""
    from django.http import UnreadablePostError
    from django.test import Client

    reset = ConnectionResetError(104, "Connection reset by peer")
    with pytest.raises(UnreadablePostError, match="reset"):
        Client().post(
            "/login", data=b'{"amount": 5}', content_type=JSON,
            headers={"Idempotency-Key": "n1"}, **{"wsgi.input": Upload([], reset)},
        )  # fmt: skip


# ---- CSRF-protected views: browser forms ----------------------------------------------------

SECRET = "a" * 32  # a CSRF secret, as the csrftoken cookie carries it
FORM = "application/x-www-form-urlencoded"
#: The project's two form views and the header each is keyed by.
FORM_VIEWS = [("/forms", "Idempotency-Key"), ("/forms-by-request-id", "Request-Id")]


@pytest.fixture
def csrf(project: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The project with CsrfViewMiddleware below idemkey's, as docs/django.md's "CSRF"
    has a browser view: protected, its page sending the token in X-CSRFToken."""
    from django.test.utils import override_settings

    from tests.frameworks.djangoproject import settings as project_settings

    with override_settings(MIDDLEWARE=project_settings.CSRF_MIDDLEWARE):
        yield project


def browser(client_class: Any = None) -> Any:
    from django.test import Client

    client = (client_class or Client)(enforce_csrf_checks=True)
    client.cookies["csrftoken"] = SECRET
    return client


def receipt(size: int = 4) -> Any:
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile("receipt.txt", b"x" * size, content_type="text/plain")


@pytest.mark.parametrize("form", ["multipart", "urlencoded"])
@pytest.mark.parametrize(("path", "header"), FORM_VIEWS)
def test_a_csrf_protected_view_takes_a_keyed_form(
    csrf: dict[str, Any], real_client: redis.Redis, prefix: str, form: str, path: str, header: str
) -> None:
    """CsrfViewMiddleware reads request.POST before the view, which consumes a multipart
    stream; idemkey has read the body first, so the form and its fingerprint are whole."""
    client = browser()

    def send(amount: str, key: str = "f1", token: str | None = SECRET) -> Any:
        headers = {header: key, **({"X-CSRFToken": token} if token else {})}
        if form == "multipart":
            data = {"amount": amount, "receipt": receipt()}
            return client.post(path, data, headers=headers)
        return client.post(path, f"amount={amount}", content_type=FORM, headers=headers)

    first = send("10")
    assert first.status_code == 201, first.content
    size = 4 if form == "multipart" else None
    assert first.json() == {"run": 1, "amount": "10", "receipt": size}
    again = send("10")
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    reused = send("11")  # the same key, another form: fingerprinted, not an empty body
    assert reused.status_code == 422
    assert reused.json()["code"] == "key_reused"
    refused = send("12", key="f2", token=None)
    assert refused.status_code == 403  # CSRF's answer: the view never began, nothing stored
    fixed = send("12", key="f2")  # the same key with the token runs
    assert fixed.status_code == 201
    assert fixed.json()["run"] == 2
    assert runs(real_client, prefix, path.strip("/")) == 2


async def test_asgi_django_takes_a_keyed_multipart_form_on_a_csrf_protected_view(
    csrf: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import AsyncClient

    client = browser(AsyncClient)
    for path, header in FORM_VIEWS:
        headers = {header: "a1", "X-CSRFToken": SECRET}
        first = await client.post(path, {"amount": "10", "receipt": receipt()}, headers=headers)
        assert first.status_code == 201, first.content
        assert first.json() == {"run": 1, "amount": "10", "receipt": 4}
        again = await client.post(path, {"amount": "10", "receipt": receipt()}, headers=headers)
        assert again.headers["Idempotent-Replayed"] == "true"
        other = await client.post(path, {"amount": "10", "receipt": receipt(5)}, headers=headers)
        assert other.status_code == 422
        assert runs(real_client, prefix, path.strip("/")) == 1


def test_a_view_with_a_larger_limit_takes_a_form_over_the_default_one(
    csrf: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    """The body is read before the view is known, up to the largest limit a view has."""
    client = browser()
    size = 1_500_000  # over the default max_request_bytes (1 MiB), under the view's 2 MB
    headers = {"Request-Id": "big", "X-CSRFToken": SECRET}
    big = client.post("/forms-by-request-id", {"receipt": receipt(size)}, headers=headers)
    assert big.status_code == 201, big.content[:300]
    assert big.json()["receipt"] == size
    headers = {"Idempotency-Key": "big", "X-CSRFToken": SECRET}
    refused = client.post("/forms", {"receipt": receipt(size)}, headers=headers)
    assert refused.status_code == 413  # /forms keeps the default limit
    assert refused.json()["code"] == "request_too_large"
    assert runs(real_client, prefix, "forms") == 0


LATE_URLCONF = """
from django.urls import path

from idemkey.adapters.django import idempotent
from tests.frameworks.djangoproject.views import _form


@idempotent(header="{header}")
def late(request):
    return _form(request, "late")


urlpatterns = [path("late", late)]
"""


def test_the_first_request_knows_the_views_of_a_urlconf_not_yet_loaded(
    csrf: dict[str, Any],
    real_client: redis.Redis,
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process's first request loads the URLconf, which decorates its views: the first
    request must already be read as keyed for a view keyed by its own header."""
    from django.test.utils import override_settings

    header = f"Late-{uuid.uuid4().hex[:8]}"  # a header no view of this process has yet
    module = f"idemkey_late_urls_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(LATE_URLCONF.replace("{header}", header))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    with override_settings(ROOT_URLCONF=module):
        client = browser()  # a new handler: a new middleware, and its first request
        data = {"amount": "10", "receipt": receipt()}
        first = client.post("/late", data, headers={header: "l1", "X-CSRFToken": SECRET})
    assert first.status_code == 201, first.content
    assert first.json() == {"run": 1, "amount": "10", "receipt": 4}


VIEWS_URLCONF = """
from django.http import HttpResponse, JsonResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt

from idemkey.adapters.django import idempotent

RUNS = []


@method_decorator(csrf_exempt, name="dispatch")
class OnPost(View):
    @method_decorator(idempotent)
    def post(self, request):
        RUNS.append("on-post")
        return JsonResponse({"run": len(RUNS)}, status=201)


@method_decorator(csrf_exempt, name="dispatch")
@method_decorator(idempotent, name="dispatch")
class OnDispatch(View):
    def post(self, request):
        RUNS.append("on-dispatch")
        return JsonResponse({"run": len(RUNS)}, status=201)


@csrf_exempt
@idempotent
def plain(request):
    RUNS.append("plain")
    return JsonResponse({"run": len(RUNS)}, status=201)


@method_decorator(csrf_exempt, name="dispatch")
class OnPostWithOptions(View):
    @method_decorator(idempotent(required=False))
    def post(self, request):
        RUNS.append("on-post-with-options")
        return JsonResponse({"run": len(RUNS)}, status=201)


class WrappedRequest:  # Django REST framework's Request: the HttpRequest as _request
    def __init__(self, request):
        self._request = request


@csrf_exempt
def drf_like(request):
    return _drf_view(WrappedRequest(request))


@idempotent
def _drf_view(request):
    RUNS.append("drf-like")
    return JsonResponse({"run": len(RUNS)}, status=201)


@csrf_exempt
@idempotent
def overlong(request):
    RUNS.append("overlong")
    return HttpResponse(b"hello world", status=201, headers={"Content-Length": "5"})


urlpatterns = [
    path("overlong", overlong),
    path("on-post", OnPost.as_view()),
    path("on-dispatch", OnDispatch.as_view()),
    path("on-post-with-options", OnPostWithOptions.as_view()),
    path("plain", plain),
    path("drf-like", drf_like),
]
"""


def test_a_decorated_view_the_middleware_never_guarded_is_refused_not_run_unguarded(
    project: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """@idempotent on a class-based view's post() (the view Django resolves is as_view()'s),
    or a view whose project lacks the middleware, guarded nothing: every retry ran it again,
    silently. Now a ConfigurationError says how to guard it; dispatch is guarded."""
    import importlib

    from django.test import Client
    from django.test.utils import override_settings

    module = f"idemkey_cbv_urls_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(VIEWS_URLCONF)
    monkeypatch.syspath_prepend(str(tmp_path))
    urls = importlib.import_module(module)
    with override_settings(ROOT_URLCONF=module):
        client = Client(raise_request_exception=True)
        with pytest.raises(ConfigurationError, match="method_decorator"):
            post(client, "/on-post", "k1")
        first, again = post(client, "/on-dispatch", "k2"), post(client, "/on-dispatch", "k2")
        assert (first.status_code, again.status_code) == (201, 201)
        assert again.headers["Idempotent-Replayed"] == "true"
        assert post(client, "/plain", "k3").status_code == 201
        with (
            override_settings(MIDDLEWARE=[]),
            pytest.raises(ConfigurationError, match="MIDDLEWARE"),
        ):
            post(Client(raise_request_exception=True), "/plain", "k4")
        # A DRF view gets its own Request, wrapping Django's: seen through it.
        with pytest.raises(ConfigurationError, match="guards nothing"):
            post(client, "/drf-like", "k5")
        # GUARD = "all" guards the resolved view with the project's policy: a decorated post()
        # with its own options is refused too (they would be ignored).
        project["GUARD"] = "all"
        with pytest.raises(ConfigurationError, match="guards nothing"):
            post(client, "/on-post-with-options", None)
        first, again = post(client, "/on-dispatch", "k6"), post(client, "/on-dispatch", "k6")
        assert again.headers["Idempotent-Replayed"] == "true"
        del project["GUARD"]
    assert urls.RUNS == ["on-dispatch", "plain", "on-dispatch"]


def test_a_body_past_its_content_length_is_never_replayed(
    project: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A view whose body runs past the Content-Length it declares: no server sends those
    bytes, so the replay does not either (it replayed all 11, as WSGI's and ASGI's did)."""
    import importlib

    from django.test import Client
    from django.test.utils import override_settings

    module = f"idemkey_overlong_urls_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(VIEWS_URLCONF)
    monkeypatch.syspath_prepend(str(tmp_path))
    urls = importlib.import_module(module)
    with override_settings(ROOT_URLCONF=module):
        client = Client()
        post(client, "/overlong", "o1")
        again = post(client, "/overlong", "o1")
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == b"hello"
    assert urls.RUNS == ["overlong"]


def test_a_unit_test_calling_a_decorated_view_directly_runs_it_under_disabled(
    project: dict[str, Any],
) -> None:
    """A user's unit test of a view's logic with RequestFactory, no middleware: refused
    (the view would run unguarded), unless inside idemkey.testing.disabled(), which turns
    idemkey off as if it were not installed."""
    from types import SimpleNamespace

    from django.test import RequestFactory

    from idemkey.testing import disabled
    from tests.frameworks.djangoproject.views import charges

    request = RequestFactory().post("/charges", b'{"amount": 5}', content_type=JSON)
    request.user = SimpleNamespace(pk=None, is_authenticated=False)  # as auth middleware sets
    with pytest.raises(ConfigurationError, match=r"testing\.disabled"):
        charges(request)
    with disabled():
        assert charges(request).status_code == 201


class ReadsFormFirst:
    """An app's middleware that reads request.POST in its ``__call__``, listed before
    idemkey's: a multipart stream is consumed before idemkey can read it."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        request.POST  # noqa: B018
        return self.get_response(request)


def test_a_form_read_before_idemkey_is_a_problem_not_a_traceback(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import Client
    from django.test.utils import override_settings

    from tests.frameworks.djangoproject import settings as project_settings

    with override_settings(MIDDLEWARE=[f"{__name__}.ReadsFormFirst", *project_settings.MIDDLEWARE]):
        data = {"amount": "10", "receipt": receipt()}
        answer = Client().post("/forms", data, headers={"Idempotency-Key": "r1"})
    assert answer.status_code == 500
    assert answer.headers["Content-Type"] == "application/problem+json"
    assert answer.json()["code"] == "body_unavailable"
    assert "IdempotencyMiddleware before" in answer.json()["detail"]
    assert runs(real_client, prefix, "forms") == 0
    assert records(real_client, prefix) == []


def test_undecorated_and_exempt_views_are_not_guarded(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import Client

    client = Client()
    assert post(client, "/login", None).status_code == 200
    assert post(client, "/login", "same").status_code == 200
    assert post(client, "/login", "same").status_code == 200  # a key means nothing here
    assert post(client, "/webhook", "same").status_code == 200
    assert runs(real_client, prefix, "login") == 3  # each ran: nothing was replayed
    records = [k for k in real_client.scan_iter(match=f"{prefix}*") if b":runs:" not in k]
    assert records == []  # no record was ever written


def test_guard_all_guards_every_view_but_the_exempt_ones(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import Client

    project["GUARD"] = "all"
    client = Client()
    assert post(client, "/login", None).status_code == 400
    assert post(client, "/login", "k").status_code == 200
    assert post(client, "/login", "k").headers["Idempotent-Replayed"] == "true"
    assert post(client, "/webhook", None).status_code == 200  # @idempotency_exempt
    assert runs(real_client, prefix, "login") == 1


def test_the_scope_is_the_user_and_the_route_is_the_resolver_pattern(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import Client

    events: list[Event] = []
    project["ON_EVENT"] = events.append
    client = Client()
    alice = post(client, "/charges", "same", Authorization="Token alice")
    bob = post(client, "/charges", "same", Authorization="Token bob")
    assert alice.json()["user"] == "alice"
    assert bob.json()["user"] == "bob"  # another user: another record, another run
    again = post(client, "/charges", "same", Authorization="Token alice:another-session")
    assert again.json() == alice.json()  # the same user, whatever the credential
    assert again.headers["Idempotent-Replayed"] == "true"
    assert runs(real_client, prefix, "charges") == 2
    for charge_id in (1, 2, 3):
        assert post(client, f"/charges/{charge_id}/refund", f"r{charge_id}").status_code == 200
    assert post(client, "/charges/1/refund", None).status_code == 200  # required=False
    routes = {event.route for event in events}
    assert routes == {"/charges", "/charges/<int:charge_id>/refund"}


def test_a_scope_callable_from_settings(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import Client

    project["SCOPE"] = lambda request: request.headers.get("X-Tenant", "none")
    client = Client()
    one = post(client, "/charges", "k", X_Tenant="t1", Authorization="Token a")
    same = post(client, "/charges", "k", X_Tenant="t1", Authorization="Token b")
    assert same.json() == one.json()  # one tenant, whoever the user
    assert same.headers["Idempotent-Replayed"] == "true"
    assert runs(real_client, prefix, "charges") == 1


def test_a_duplicate_while_the_first_runs_is_409(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import Client

    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(post(Client(), "/slow", "s")))
    first.start()
    try:
        wait_until(lambda: real_client.exists(f"{prefix}:started"), 10, "the first request")
        duplicate = post(Client(), "/slow", "s")
    finally:
        real_client.set(f"{prefix}:gate", 1)
        first.join(15)
    assert duplicate.status_code == 409
    assert duplicate.headers["Retry-After"] == "1"
    assert [r.status_code for r in results] == [200]
    assert post(Client(), "/slow", "s").headers["Idempotent-Replayed"] == "true"


async def test_asgi_django_through_the_async_test_client(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import AsyncClient

    client = AsyncClient()
    headers = {"Idempotency-Key": "a1"}
    data = json.dumps({"amount": 7})
    first = await client.post("/charges", data=data, content_type=JSON, headers=headers)
    again = await client.post("/charges", data=data, content_type=JSON, headers=headers)
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert runs(real_client, prefix, "charges") == 1
    one = await client.post("/async-charges", data=data, content_type=JSON, headers=headers)
    two = await client.post("/async-charges", data=data, content_type=JSON, headers=headers)
    assert (one.status_code, two.status_code) == (201, 201)
    assert two.headers["Idempotent-Replayed"] == "true"
    assert one.json() == {"async": True, "body": data}


# ---- real servers ---------------------------------------------------------------------------


@contextlib.contextmanager
def serving(
    command: list[str], redis_url: str, prefix: str, log: Path, **env: str
) -> Iterator[str]:
    def argv(port: int) -> list[str]:
        return [sys.executable, "-m", *[part.replace("PORT", str(port)) for part in command]]

    with AppServer(
        argv, log=log, cwd=ROOT, env={"DJANGO_SETTINGS_MODULE": f"{PROJECT}.settings", **env},
        redis_url=redis_url, prefix=prefix,
    ) as server:  # fmt: skip
        yield server.url


SERVERS = {
    "gunicorn-wsgi": [
        "gunicorn", "--worker-class", "gthread", "--threads", "4", "--bind", "127.0.0.1:PORT",
        "--log-level", "warning", f"{PROJECT}.wsgi:application",
    ],
    "uvicorn-asgi": [
        "uvicorn", "--port", "PORT", "--log-level", "warning", f"{PROJECT}.asgi:application",
    ],
}  # fmt: skip


@pytest.mark.parametrize("server", list(SERVERS))
def test_a_real_server_sees_replays_409_and_422(
    server: str, redis_url: str, prefix: str, real_client: redis.Redis, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    with (
        serving(SERVERS[server], redis_url, prefix, log) as base,
        httpx.Client(base_url=base, timeout=20) as http,
    ):
        if True:
            key = {"Idempotency-Key": "k1", "Content-Type": JSON}
            first = http.post("/charges", content=b'{"amount": 5}', headers=key)
            again = http.post("/charges", content=b'{"amount": 5}', headers=key)
            assert (first.status_code, again.status_code) == (201, 201)
            assert again.headers["Idempotent-Replayed"] == "true"
            assert again.content == first.content
            reused = http.post("/charges", content=b'{"amount": 6}', headers=key)
            assert reused.status_code == 422
            assert runs(real_client, prefix, "charges") == 1

            results: list[httpx.Response] = []
            slow = threading.Thread(
                target=lambda: results.append(http.post("/slow", headers={"Idempotency-Key": "s"}))
            )
            slow.start()
            try:
                wait_until(lambda: real_client.exists(f"{prefix}:started"), 10, "the first run")
                duplicate = http.post("/slow", headers={"Idempotency-Key": "s"})
            finally:
                real_client.set(f"{prefix}:gate", 1)
                slow.join(15)
            assert duplicate.status_code == 409
            assert duplicate.json()["code"] == "in_flight"
            assert [r.status_code for r in results] == [200]
            assert runs(real_client, prefix, "slow") == 1


def test_asgi_django_keeps_the_key_of_a_view_its_client_left(
    redis_url: str, prefix: str, real_client: redis.Redis, tmp_path: Path
) -> None:
    """Django 5 under ASGI cancels a request whose client left; the cancel comes out of the
    view's thread after the view did its work. The key is kept until its lease lapses (an
    uncertain `cancelled` entry), so the retry is a 409, not a second run (it was released)."""
    log = tmp_path / "server.log"
    with serving(SERVERS["uvicorn-asgi"], redis_url, prefix, log) as base:
        port = urlsplit(base).port
        assert port is not None
        head = (
            "POST /slow HTTP/1.1\r\nHost: t\r\nIdempotency-Key: gone\r\nContent-Length: 0\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(head.encode())
            wait_until(lambda: real_client.exists(f"{prefix}:started"), 10, "the view to start")
        # The client has gone; the view is still running. Let it finish.
        real_client.set(f"{prefix}:gate", 1)

        def settled() -> bool:
            if real_client.exists(f"{prefix}:uncertain"):
                return True  # kept, and said so
            records = real_client.scan_iter(match=f"{prefix}:{{*}}", _type="hash")
            return all(real_client.hget(key, "state") != b"in_progress" for key in records)

        wait_until(settled, 15, "the cancelled request to be settled")
        with httpx.Client(base_url=base, timeout=20) as http:
            retry = http.post("/slow", headers={"Idempotency-Key": "gone"})
        assert retry.status_code == 409, retry.text
        assert runs(real_client, prefix, "slow") == 1
        (entry,) = real_client.xrange(f"{prefix}:uncertain")
        assert entry[1][b"kind"] == b"cancelled"


CHUNKED_HEAD = (
    "POST /charges HTTP/1.1\r\nHost: t\r\nConnection: close\r\nIdempotency-Key: {key}\r\n"
    "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
)
#: case -> (bytes after the head, half-close after sending): broken as in test_edges_servers
BROKEN_CHUNKS = {
    "bad-size": (b'zz\r\n{"amount": 5}\r\n0\r\n\r\n', False),
    "no-terminator": (b'd\r\n{"amount": 5}XX0\r\n\r\n', False),
    "closed-mid-chunk": (b'20\r\n{"amount": 5}', True),
}


def test_gunicorn_answers_a_broken_chunked_body_400_invalid_body(
    redis_url: str, prefix: str, real_client: redis.Redis, tmp_path: Path
) -> None:
    """gunicorn's reader raises on a broken chunked body (InvalidChunkSize, NoMoreData): the
    answer is the WSGI middleware's on the same server, and the honest retry runs."""
    log = tmp_path / "server.log"
    with (
        serving(SERVERS["gunicorn-wsgi"], redis_url, prefix, log) as base,
        httpx.Client(base_url=base, timeout=20) as http,
    ):
        port = urlsplit(base).port
        for n, (case, (chunks, close_write)) in enumerate(BROKEN_CHUNKS.items()):
            key = f"g{n}"
            with socket.create_connection(("127.0.0.1", port or 0), timeout=20) as sock:
                sock.sendall(CHUNKED_HEAD.format(key=key).encode() + chunks)
                if close_write:
                    sock.shutdown(socket.SHUT_WR)
                reply = read_response(sock)
            assert reply.status == 400, (case, reply)
            assert reply.header("Content-Type") == "application/problem+json", (case, reply)
            assert json.loads(reply.body)["code"] == "invalid_body", (case, reply)
            assert runs(real_client, prefix, "charges") == n, case  # never ran on it
            headers = {"Idempotency-Key": key, "Content-Type": JSON}
            full = http.post("/charges", content=b'{"amount": 5}', headers=headers)
            assert full.status_code == 201, (case, full.text)  # nothing stored: it runs
            assert runs(real_client, prefix, "charges") == n + 1, case
    assert "Traceback" not in log.read_text(errors="replace")


def multipart(amount: str, receipt: bytes) -> tuple[bytes, str]:
    """A form as a browser's FormData sends it, with a fixed boundary (so a retry is the
    same bytes): the body and its Content-Type."""
    boundary = "idemkey-test-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="amount"\r\n\r\n{amount}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="receipt"; '
        'filename="receipt.txt"\r\nContent-Type: text/plain\r\n\r\n'
    )
    body = head.encode() + receipt + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


@pytest.mark.parametrize("server", list(SERVERS))
def test_a_real_server_takes_a_keyed_multipart_form_on_a_csrf_protected_view(
    server: str, redis_url: str, prefix: str, real_client: redis.Redis, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    with (
        serving(SERVERS[server], redis_url, prefix, log, IDEMKEY_TEST_CSRF="1") as base,
        httpx.Client(base_url=base, timeout=20) as http,
    ):
        for path, header in FORM_VIEWS:
            body, content_type = multipart("10", b"paid")
            headers = {
                header: "m1", "Content-Type": content_type, "X-CSRFToken": SECRET,
                "Cookie": f"csrftoken={SECRET}",
            }  # fmt: skip
            first = http.post(path, content=body, headers=headers)
            assert first.status_code == 201, (path, first.text)
            assert first.json() == {"run": 1, "amount": "10", "receipt": 4}
            again = http.post(path, content=body, headers=headers)
            assert again.headers["Idempotent-Replayed"] == "true", path
            other, _ = multipart("11", b"paid")
            reused = http.post(path, content=other, headers=headers)
            assert reused.status_code == 422, (path, reused.text)
            no_token = {k: v for k, v in headers.items() if k != "X-CSRFToken"}
            assert http.post(path, content=other, headers=no_token).status_code == 403
            assert runs(real_client, prefix, path.strip("/")) == 1
    assert "Traceback" not in log.read_text(errors="replace")


DEAD = "redis://127.0.0.1:1/0"
#: A client object (not a factory), named by its dotted path in IDEMKEY["CLIENT"] below.
A_CLIENT = redis.Redis.from_url(DEAD)


def broken_factory() -> redis.Redis:
    raise RuntimeError("no REDIS_HOST in the environment")


def test_a_client_object_at_a_dotted_path_is_the_client() -> None:
    # The docs say "a client, a factory or its path": on main, a path to a client was called.
    from django.test.utils import override_settings

    from idemkey.adapters.django import IdempotencyMiddleware
    from tests.adapters.harness_wsgi import _django

    _django()
    with override_settings(IDEMKEY={"CLIENT": f"{__name__}.A_CLIENT"}):
        assert IdempotencyMiddleware(lambda request: None).store.client is A_CLIENT


def test_a_client_factory_that_raises_is_a_configuration_error_chained_to_its_error() -> None:
    from django.test.utils import override_settings

    from idemkey import ConfigurationError
    from idemkey.adapters.django import IdempotencyMiddleware
    from tests.adapters.harness_wsgi import _django

    _django()
    with (
        override_settings(IDEMKEY={"CLIENT": f"{__name__}.broken_factory"}),
        pytest.raises(
            ConfigurationError, match=r'IDEMKEY\["CLIENT"\]: .* raised RuntimeError'
        ) as raised,
    ):
        IdempotencyMiddleware(lambda request: None)
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_a_scope_returning_none_is_a_500_problem_not_a_traceback(
    project: dict[str, Any], real_client: redis.Redis, prefix: str
) -> None:
    from django.test import Client

    project["SCOPE"] = lambda request: None  # "anonymous": no tenant
    answer = post(Client(raise_request_exception=False), "/charges", "k")
    assert answer.status_code == 500
    assert answer.headers["Content-Type"] == "application/problem+json"
    assert answer.json()["code"] == "invalid_scope"
    assert runs(real_client, prefix, "charges") == 0
    assert records(real_client, prefix) == []


def make_client() -> redis.Redis:
    """A client factory, named by its dotted path in IDEMKEY["CLIENT"] below."""
    from django.conf import settings

    return redis.Redis.from_url(settings.REDIS_URL)


@pytest.mark.parametrize(
    "client", [make_client, f"{__name__}.make_client"], ids=["callable", "dotted-path"]
)
def test_the_client_from_a_factory(project: dict[str, Any], client: Any) -> None:
    from django.test import Client

    del project["REDIS_URL"]
    project["CLIENT"] = client
    django = Client()
    assert post(django, "/charges", "f").status_code == 201
    assert post(django, "/charges", "f").headers["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"PREFIX": "x"}, "REDIS_URL"),
        ({"REDIS_URL": "redis://127.0.0.1:1/0", "GUARD": "some"}, "GUARD"),
        (
            {"REDIS_URL": "redis://127.0.0.1:1/0", "TLL": 5},
            r'IDEMKEY\["TLL"\] \(Django settings\): not a Policy field; did you mean IDEMKEY\["TTL',
        ),
        ({"STORE": "not a store"}, "STORE"),
        # Each of these was accepted (the default scope used) or an untyped error on main.
        (
            "redis://127.0.0.1:1/0",
            r'settings.IDEMKEY must be a dict, got str: IDEMKEY = \{"REDIS_URL"',
        ),
        ({"REDIS_URL": DEAD, "SCOPE": 123}, r'IDEMKEY\["SCOPE"\]: expected a callable .*got int'),
        ({"REDIS_URL": DEAD, "SCOPE": "nowhere.scope"}, r'IDEMKEY\["SCOPE"\]: cannot import'),
        ({"REDIS_URL": DEAD, "SCOPE": ""}, r'IDEMKEY\["SCOPE"\]: cannot import'),
        ({"CLIENT": DEAD}, r'IDEMKEY\["CLIENT"\]: .*a URL goes in IDEMKEY\["REDIS_URL"\]'),
        ({"CLIENT": "nowhere.client"}, r'IDEMKEY\["CLIENT"\]: cannot import'),
        ({"CLIENT": 123}, r'IDEMKEY\["CLIENT"\]: expected a redis-py or valkey client, got int'),
        ({"CLIENT": lambda: None}, r'IDEMKEY\["CLIENT"\]: expected a redis-py .*got NoneType'),
        ({"REDIS_URL": 6379}, r'IDEMKEY\["REDIS_URL"\]: expected a URL string, got int'),
        ({"REDIS_URL": DEAD, "TTL": 100, "ttl": 5}, r'IDEMKEY has both "TTL" and "ttl"'),
    ],
)
def test_bad_settings_are_configuration_errors(settings: object, error: str) -> None:
    from django.test.utils import override_settings

    from idemkey import ConfigurationError
    from idemkey.adapters.django import IdempotencyMiddleware
    from tests.adapters.harness_wsgi import _django

    _django()
    with override_settings(IDEMKEY=settings), pytest.raises(ConfigurationError, match=error):
        IdempotencyMiddleware(lambda request: None)
