"""Where idemkey's middleware sits in ``MIDDLEWARE``: a new project set up as docs/django.md
says (``django-admin startproject``, then the page's files as printed), on real servers.

idemkey's middleware settles the record when the response comes back up through it, so every
middleware listed below it has finished with the response by then. A new project's
``SessionMiddleware`` saves the session after the view: when that save fails (the session was
deleted by a logout in another tab: Django answers 400; its database is down: 500), the client
never got the view's 201, and the retry must run again rather than be replayed a 201 whose
session write never happened. Listed first, idemkey's middleware sees that answer and releases
the key; appended last, it stored the view's 201 before the session was saved.

Listed first, it still decides after every middleware's request side (``process_view``):
``AuthenticationMiddleware`` has set ``request.user`` (the scope of a logged-in request is its
user), and a CSRF-protected view's ``403`` releases the key, so the retry with the token runs.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from idemkey._core import record_for
from tests._servers import HOST, RedisServer
from tests.frameworks.test_docs_pages import executable, page, printed, serving, write_files

pytestmark = pytest.mark.redis

PREFIX = "django-payments"  # the page's IDEMKEY["PREFIX"]

#: A session store (the signed-cookie one: no table) whose save fails once when the test asks,
#: as a database-backed one does when another request deleted the session (a logout).
FLAKY_SESSIONS = """
import redis
from django.conf import settings
from django.contrib.sessions.backends.base import UpdateError
from django.contrib.sessions.backends.signed_cookies import SessionStore as Signed


class SessionStore(Signed):
    def save(self, must_create=False):
        client = redis.Redis.from_url(settings.IDEMKEY["REDIS_URL"])
        try:
            if client.getdel("order-test:fail-session-save"):
                raise UpdateError
        finally:
            client.close()
        return super().save(must_create)
"""

#: Views of the test, next to the page's: each counts its runs per key in Redis.
VIEWS = """
import redis
from django.conf import settings
from django.contrib.auth import get_user_model, login
from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from idemkey.adapters.django import idempotent


def counted(request):
    client = redis.Redis.from_url(settings.IDEMKEY["REDIS_URL"])
    try:
        return client.incr("order-test:runs:" + request.headers["Idempotency-Key"])
    finally:
        client.close()


@csrf_exempt
@idempotent
def orders(request):
    run = counted(request)
    request.session["last_order"] = run  # SessionMiddleware saves it after the view
    return JsonResponse({"order": run}, status=201)


@idempotent
def browser_orders(request):  # CSRF-protected: a page's fetch() sends X-CSRFToken
    return JsonResponse({"order": counted(request)}, status=201)


@csrf_exempt
def sign_in(request):
    user, _ = get_user_model().objects.get_or_create(username=request.GET["name"])
    login(request, user)
    return JsonResponse({"pk": user.pk})


urlpatterns = [
    path("orders", orders),
    path("browser-orders", browser_orders),
    path("sign-in", sign_in),
]
"""

SETTINGS = '\nSESSION_ENGINE = "mysite.flaky_sessions"\n'
URLS = "\nfrom . import order_views  # noqa: E402\n\nurlpatterns += order_views.urlpatterns\n"

#: The servers the page names for production: gunicorn (WSGI) and uvicorn (ASGI Django).
SERVERS: dict[str, Callable[[int], list[str]]] = {
    "gunicorn": lambda port: [executable("gunicorn"), "mysite.wsgi", "--bind", f"{HOST}:{port}"],
    "uvicorn": lambda port: [
        executable("uvicorn"), "mysite.asgi:application", "--host", HOST, "--port", str(port),
    ],
}  # fmt: skip


@pytest.fixture(params=list(SERVERS))
def served(
    request: pytest.FixtureRequest, tmp_path: Path, private_redis_server: RedisServer
) -> Iterator[tuple[str, redis.Redis]]:
    """A new project with the page's files as printed, the test's views and session store,
    its database migrated (users), behind one server on a Redis of its own: its base URL and
    that Redis."""
    startproject = printed(page("django.md"), "django-admin startproject mysite")
    subprocess.run([executable("django-admin"), *startproject[1:]], cwd=tmp_path, check=True)
    project = tmp_path / "mysite"
    write_files(page("django.md"), project, private_redis_server.url)
    (project / "mysite" / "flaky_sessions.py").write_text(FLAKY_SESSIONS)
    (project / "mysite" / "order_views.py").write_text(VIEWS)
    for name, extra in (("settings.py", SETTINGS), ("urls.py", URLS)):
        with (project / "mysite" / name).open("a") as file:
            file.write(extra)
    migrate = [sys.executable, "manage.py", "migrate", "-v", "0"]
    subprocess.run(migrate, cwd=project, check=True)
    with (
        serving(SERVERS[request.param], project) as base,
        contextlib.closing(redis.Redis.from_url(private_redis_server.url)) as client,
    ):
        yield base, client


def runs(client: redis.Redis, key: str) -> int:
    return int(client.get(f"order-test:runs:{key}") or 0)


def record(client: redis.Redis, scope: str, path: str, key: str) -> dict[bytes, bytes]:
    """The fields of the record of ``key`` on ``path``: ``resp`` once completed, ``state``
    while claimed, neither once released (or never claimed)."""
    fields: dict[bytes, bytes] = client.hgetall(record_for(PREFIX, scope, "POST", path, key).key)
    return fields


def test_a_session_save_failing_after_the_view_releases_the_key(
    served: tuple[str, redis.Redis],
) -> None:
    base, client = served
    key = {"Idempotency-Key": "order-1001"}
    client.set("order-test:fail-session-save", 1)
    with httpx.Client(base_url=base, timeout=20) as http:
        first = http.post("/orders", headers=key)
        assert first.status_code == 400, first.text  # SessionInterrupted: no 201 reached it
        retry = http.post("/orders", headers=key)
        assert retry.status_code == 201, retry.text
        assert "Idempotent-Replayed" not in retry.headers  # run again: the session is saved
        assert "sessionid" in retry.cookies
        http.cookies.clear()  # a cookie is a credential: the same client, as it first came
        again = http.post("/orders", headers=key)
    assert runs(client, "order-1001") == 2
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == retry.json()
    assert "sessionid" not in again.cookies  # a replay hands out no session


def test_the_scope_of_a_signed_in_request_is_its_user(served: tuple[str, redis.Redis]) -> None:
    """``request.user`` is set when idemkey decides. Its ``process_view`` comes before CSRF's:
    the user's replay, which changes nothing, is answered without the token."""
    base, client = served
    with httpx.Client(base_url=base, timeout=20) as http:
        pk = http.post("/sign-in", params={"name": "ann"}).json()["pk"]
        first = http.post("/orders", headers={"Idempotency-Key": "o-ann"})
        assert first.status_code == 201, first.text
        key = {"Idempotency-Key": "f-ann"}
        signed = {**key, "X-CSRFToken": http.cookies["csrftoken"], "Origin": base}
        form = http.post("/browser-orders", headers=signed)
        unsigned = http.post("/browser-orders", headers=key)
    assert b"resp" in record(client, f"user:{pk}", "/orders", "o-ann")
    assert (form.status_code, unsigned.status_code) == (201, 201), unsigned.text
    assert unsigned.headers["Idempotent-Replayed"] == "true"
    assert runs(client, "f-ann") == 1


def test_a_csrf_403_releases_the_key_and_the_retry_with_the_token_runs(
    served: tuple[str, redis.Redis],
) -> None:
    base, client = served
    key = {"Idempotency-Key": "o-form"}
    token = "a" * 32  # the csrftoken cookie's secret: its header may send it as it is
    with httpx.Client(base_url=base, timeout=20, cookies={"csrftoken": token}) as http:
        refused = http.post("/browser-orders", headers=key)  # the cookie, not the header
        assert refused.status_code == 403, refused.text
        assert runs(client, "o-form") == 0
        signed = {**key, "X-CSRFToken": token, "Origin": base}
        first = http.post("/browser-orders", headers=signed)
        again = http.post("/browser-orders", headers=signed)
    assert (first.status_code, again.status_code) == (201, 201), first.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert runs(client, "o-form") == 1
