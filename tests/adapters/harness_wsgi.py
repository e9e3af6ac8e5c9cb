"""WSGI harnesses: "flask" (the extension), "wsgi" (the middleware around a plain PEP 3333
callable) and "django" (the middleware around a minimal Django app).

Requests go through the real WSGI interface, in-process: :func:`call_wsgi` builds a PEP 3333
environ and plays the server, under ``wsgiref.validate.validator``, which asserts that the
adapter and the app keep to PEP 3333 (start_response before the body, bytes chunks, close()).
The request body is a stream that fails the test if anyone reads past ``CONTENT_LENGTH`` (on a
real socket, that read would hang).
"""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any
from wsgiref.validate import validator

from flask import Flask
from flask import Response as FlaskResponse
from flask import request as flask_request

from idemkey import Policy, RedisStore
from idemkey.adapters.flask import Idemkey
from idemkey.adapters.wsgi import IdempotencyMiddleware
from tests.adapters.harness import Answer, Backend, HarnessFactory, Reply, Stream, sync_redis

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = ["HARNESSES", "StrictInput", "call_wsgi", "environ_for"]


class StrictInput(io.BytesIO):
    """``wsgi.input`` that fails loudly on a read past the declared body (a socket would hang)."""

    def __init__(self, body: bytes, terminated: bool) -> None:
        super().__init__(body)
        self.size, self.terminated = len(body), terminated

    def read(self, size: int | None = -1) -> bytes:
        if not self.terminated and (size is None or size < 0 or self.tell() + size > self.size):
            raise AssertionError("read past CONTENT_LENGTH: a real server would hang here")
        return super().read(size)


def environ_for(
    method: str, path: str, headers: Sequence[tuple[str, str]] = (), body: bytes = b""
) -> dict[str, Any]:
    """A PEP 3333 environ; repeated header lines are joined with ", " as servers do."""
    path, _, query = path.partition("?")
    chunked = any(n.lower() == "transfer-encoding" and "chunked" in v.lower() for n, v in headers)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "SERVER_NAME": "testserver",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_HOST": "testserver",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": StrictInput(body, terminated=chunked),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    if chunked:
        environ["wsgi.input_terminated"] = True
    elif body or method in ("POST", "PUT", "PATCH"):
        environ["CONTENT_LENGTH"] = str(len(body))
    for name, value in headers:
        key = name.upper().replace("-", "_")
        if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            key = "HTTP_" + key
            if key in environ and key != "HTTP_HOST":
                value = environ[key] + ", " + value
        environ[key] = value
    return environ


def call_wsgi(
    app: WSGIApplication,
    method: str,
    path: str,
    *,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes = b"",
) -> Reply:
    """Play a WSGI server for one request; an app exception is a 500, as a server sends."""
    started: list[Any] = []
    written: list[bytes] = []

    def start_response(status: str, response_headers: list[tuple[str, str]], exc_info: Any = None):  # type: ignore[no-untyped-def]
        started[:] = [status, response_headers]
        return written.append

    environ = environ_for(method, path, headers, body)
    try:
        result = validator(app)(environ, start_response)
    except AssertionError:
        raise  # PEP 3333 broken (wsgiref.validate) or a read past CONTENT_LENGTH
    except Exception:
        return Reply(500, [], b"Internal Server Error")
    try:
        for chunk in result:
            written.append(chunk)
    except AssertionError:
        raise
    except Exception:
        return Reply(500, [], b"Internal Server Error")
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return Reply(int(started[0][:3]), list(started[1]), b"".join(written))


class WSGIHarness:
    """A WSGI app, its Backend and its store; requests through :func:`call_wsgi`."""

    def __init__(self, name: str, app: WSGIApplication, backend: Backend, store: RedisStore):
        self.name, self.app, self.backend, self.store = name, app, backend, store
        self.executions = backend.executions
        self.gate = backend.gate

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        body: bytes = b"",
    ) -> Reply:
        return call_wsgi(self.app, method, path, headers=headers, body=body)

    def close(self) -> None:
        self.gate.set()  # release any request still parked on the gate
        self.store.close()
        self.store.client.close()


# ---- plain WSGI ------------------------------------------------------------------------------


def plain_app(backend: Backend) -> WSGIApplication:
    """A PEP 3333 callable with no framework: routes from ``Backend.dispatch``."""

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        answer = backend.dispatch(environ["REQUEST_METHOD"], environ["PATH_INFO"], body)
        reason = f"{answer.status} Whatever"
        if isinstance(answer, Stream):
            start_response(reason, answer.headers)
            return answer.chunks
        start_response(reason, [*answer.headers, ("Content-Length", str(len(answer.body)))])
        return [answer.body]

    return app


def make_wsgi(redis_url: str | None, policy: Policy) -> WSGIHarness:
    backend = Backend(policy.max_response_bytes)
    store = RedisStore(sync_redis(redis_url), policy)
    return WSGIHarness("wsgi", IdempotencyMiddleware(plain_app(backend), store), backend, store)


# ---- Flask -----------------------------------------------------------------------------------


def _flask_response(answer: Answer | Stream) -> FlaskResponse:
    if isinstance(answer, Stream):
        return FlaskResponse(answer.chunks, status=answer.status, headers=answer.headers)
    response = FlaskResponse(answer.body, status=answer.status, headers=answer.headers)
    if not any(
        n.lower() == "content-type" for n, _ in answer.headers
    ):  # no content, so no Content-Type (PEP 3333 validator)
        del response.headers["Content-Type"]
    return response


def make_flask(redis_url: str | None, policy: Policy) -> WSGIHarness:
    backend = Backend(policy.max_response_bytes)
    store = RedisStore(sync_redis(redis_url), policy)
    app = Flask(f"harness_{id(backend)}")
    idem = Idemkey(app, store=store, policy=policy)

    def body() -> bytes:
        return flask_request.get_data()

    @app.route("/charges", methods=["POST", "GET"])
    @idem.idempotent
    def charges() -> FlaskResponse:
        if flask_request.method == "GET":
            return _flask_response(backend.simple("list", 200))
        return _flask_response(backend.charge("charges", body()))

    @app.route("/charges/<int:charge_id>", methods=["PATCH", "PUT", "DELETE"])
    @idem.idempotent
    def charge(charge_id: int) -> FlaskResponse:
        return _flask_response(backend.dispatch(flask_request.method, flask_request.path, body()))

    @app.post("/status/<int:code>")
    @idem.idempotent
    def status(code: int) -> FlaskResponse:
        return _flask_response(backend.simple("status", code))

    @app.post("/matrix/<kind>")
    @idem.idempotent
    def matrix(kind: str) -> FlaskResponse:
        return _flask_response(backend.matrix(kind))

    @app.post("/<any(refunds, explode, fail500, declined, slow, big, stream):name>")
    @idem.idempotent
    def other(name: str) -> FlaskResponse:
        return _flask_response(backend.dispatch("POST", "/" + name, body()))

    return WSGIHarness("flask", app, backend, store)


# ---- Django ----------------------------------------------------------------------------------

_django_lock = threading.Lock()
_django_app: WSGIApplication | None = None
BACKEND_KEY = "harness.backend"


def _django_view(request: Any, *args: Any, **kwargs: Any) -> Any:
    from django.http import HttpResponse, StreamingHttpResponse

    backend: Backend = request.META[BACKEND_KEY]
    answer = backend.dispatch(request.method, request.path_info, request.body)
    if isinstance(answer, Stream):
        response: Any = StreamingHttpResponse(answer.chunks, status=answer.status)
    else:
        response = HttpResponse(answer.body, status=answer.status)
        if not any(n.lower() == "content-type" for n, _ in answer.headers):
            del response["Content-Type"]  # none declared (a 204, a redirect): none sent
    for name, value in answer.headers:
        if name.lower() == "set-cookie":
            cookie_name, _, rest = value.partition("=")
            httponly = "httponly" in rest.lower()
            response.set_cookie(cookie_name, rest.split(";")[0], path="/", httponly=httponly)
        else:
            response[name] = value
    return response


def _django() -> WSGIApplication:
    """Django, configured once per process (settings are global), routed to ``_django_view``."""
    global _django_app
    with _django_lock:
        if _django_app is None:
            import django
            from django.conf import settings
            from django.core.wsgi import get_wsgi_application

            if not settings.configured:
                settings.configure(
                    DEBUG=False,
                    SECRET_KEY="idemkey-tests",
                    ALLOWED_HOSTS=["testserver"],
                    ROOT_URLCONF=__name__,
                    MIDDLEWARE=[],
                    INSTALLED_APPS=[],
                    USE_TZ=True,
                )
            django.setup()
            _django_app = get_wsgi_application()
        return _django_app


def __getattr__(name: str) -> Any:
    if name == "urlpatterns":  # ROOT_URLCONF: built lazily so importing this needs no Django
        from django.urls import path, re_path

        return [
            path("charges", _django_view),
            path("charges/1", _django_view),
            path("status/<int:code>", _django_view),
            re_path(r"^(refunds|explode|fail500|declined|slow|big|stream)$", _django_view),
            re_path(r"^matrix/[a-z-]+$", _django_view),
        ]
    raise AttributeError(name)


def make_django(redis_url: str | None, policy: Policy) -> WSGIHarness:
    backend = Backend(policy.max_response_bytes)
    store = RedisStore(sync_redis(redis_url), policy)
    django_app = _django()

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        environ[BACKEND_KEY] = backend  # Django settings are global; each harness its own state
        return django_app(environ, start_response)

    return WSGIHarness("django", IdempotencyMiddleware(app, store), backend, store)


HARNESSES: dict[str, HarnessFactory] = {
    "flask": make_flask,
    "wsgi": make_wsgi,
    "django": make_django,
}
