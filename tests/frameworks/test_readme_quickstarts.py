"""The README's quick starts for Flask, FastAPI, Starlette, Django and plain WSGI work as copied.

Each snippet is taken from README.md by its heading, run as it is (only the Redis URL is
replaced, by a private real redis-server's), and driven through its framework: a guarded route
replays and needs its key, an unguarded one needs none.
"""

from __future__ import annotations

import io
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._servers import RedisServer

README = Path(__file__).resolve().parents[2] / "README.md"
KEY = {"Idempotency-Key": "k1"}


def snippets(heading: str, url: str) -> list[str]:
    """The ```python blocks under ``### heading``, with the README's Redis URL replaced."""
    text = README.read_text()
    start = text.index(f"\n### {heading}\n")
    following = re.search(r"\n#{2,3} ", text[start + 5 :])
    section = text[start : start + 5 + following.start() if following else None]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, heading
    return [block.replace("redis://localhost:6379/0", url) for block in blocks]


def run(code: str, name: str) -> dict[str, Any]:
    module = types.ModuleType(name)
    sys.modules[name] = module  # FastAPI and Django look definitions up by module
    exec(compile(code, f"README:{name}", "exec"), module.__dict__)
    return module.__dict__


@pytest.fixture
def url(private_redis_server: RedisServer) -> str:
    return private_redis_server.url  # the snippets use the default prefix: a server of their own


def test_flask(url: str) -> None:
    (code,) = snippets("Flask", url)
    client = run(code, "readme_flask")["create_app"]().test_client()
    first = client.post("/charges", headers=KEY)
    again = client.post("/charges", headers=KEY)
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert client.post("/charges").status_code == 400


async def asgi_checks(app: Any, refund: str | None) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        first = await http.post("/charges", json={"amount": 5}, headers=KEY)
        again = await http.post("/charges", json={"amount": 5}, headers=KEY)
        assert (first.status_code, again.status_code) == (201, 201)
        assert again.headers["Idempotent-Replayed"] == "true"
        assert (await http.post("/charges", json={"amount": 5})).status_code == 400
        assert (await http.post("/login")).status_code == 200
        if refund is not None:
            replies = [await http.post(refund, headers=KEY) for _ in range(2)]
            assert [r.status_code for r in replies] == [200, 200]
            assert replies[1].headers["Idempotent-Replayed"] == "true"
            schema = (await http.get("/openapi.json")).json()
            assert "Idempotency-Key" in json.dumps(schema["paths"]["/charges"])
            assert "Idempotency-Key" not in json.dumps(schema["paths"]["/login"])


async def test_fastapi(url: str) -> None:
    (code,) = snippets("FastAPI", url)
    module = run(code, "readme_fastapi")
    await asgi_checks(module["app"], "/v1/charges/ch_1/refund")
    await module["store"].client.aclose()


async def test_starlette(url: str) -> None:
    (code,) = snippets("Starlette", url)
    module = run(code, "readme_starlette")
    await asgi_checks(module["app"], None)
    await module["idem"].store.client.aclose()


def test_django(url: str) -> None:
    from django.test import Client
    from django.test.utils import override_settings
    from django.urls import path

    from tests.adapters.harness_wsgi import _django

    settings_code, views_code = snippets("Django", url)
    _django()
    project = run(settings_code, "readme_django_settings")
    views = run(views_code, "readme_django_views")
    urls = types.ModuleType("readme_django_urls")
    urls.urlpatterns = [  # type: ignore[attr-defined]
        path("charges", views["create_charge"]),
        path("webhook", views["stripe_webhook"]),
    ]
    with override_settings(
        ROOT_URLCONF=urls,
        MIDDLEWARE=project["MIDDLEWARE"],
        IDEMKEY=project["IDEMKEY"],
        ALLOWED_HOSTS=["*"],
    ):
        client = Client()
        first = client.post("/charges", headers=KEY)
        again = client.post("/charges", headers=KEY)
        assert (first.status_code, again.status_code) == (201, 201)
        assert again.headers["Idempotent-Replayed"] == "true"
        assert client.post("/charges").status_code == 400
        assert client.post("/webhook").status_code == 200


def test_any_wsgi_app(url: str) -> None:
    code, _ = snippets("Any WSGI or ASGI app", url)
    application = run(code, "readme_wsgi")["application"]

    def post(path: str, headers: dict[str, str]) -> tuple[str, dict[str, str]]:
        environ = {
            "REQUEST_METHOD": "POST", "SCRIPT_NAME": "", "PATH_INFO": path, "QUERY_STRING": "",
            "CONTENT_LENGTH": "0", "SERVER_NAME": "t", "SERVER_PORT": "80",
            "wsgi.input": io.BytesIO(), "wsgi.errors": sys.stderr, "wsgi.url_scheme": "http",
            **{"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()},
        }  # fmt: skip
        started: list[Any] = []
        body = application(environ, lambda status, head, *e: started.extend([status, head]))
        b"".join(body)
        getattr(body, "close", lambda: None)()
        return started[0], dict(started[1])

    assert post("/charges", KEY)[0].startswith("201")
    _, headers = post("/charges", KEY)
    assert headers["Idempotent-Replayed"] == "true"
    assert post("/charges", {})[0].startswith("400")
    assert post("/v1/login", {})[0].startswith("201")  # exempt
    assert post("/v1/anything", {})[0].startswith("400")  # guarded by /v1/{rest:path}
    assert post("/elsewhere", {})[0].startswith("201")  # no route: not guarded


async def test_any_asgi_app(url: str) -> None:
    wsgi_code, asgi_code = snippets("Any WSGI or ASGI app", url)
    module = run(wsgi_code + "\n" + asgi_code, "readme_asgi")  # the routes come from the first
    transport = httpx.ASGITransport(app=module["asgi_application"])
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        assert (await http.post("/charges", headers=KEY)).status_code == 201
        again = await http.post("/charges", headers=KEY)
        assert again.headers["Idempotent-Replayed"] == "true"
        assert (await http.post("/charges")).status_code == 400
        assert (await http.post("/v1/login")).status_code == 201  # exempt
        assert (await http.post("/elsewhere")).status_code == 201  # no route: not guarded
    await module["astore"].client.aclose()
    module["store"].client.close()
