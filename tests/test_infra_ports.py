"""Every launcher that starts a server on a port ``free_port()`` picked survives that port being
taken first.

``free_port()`` releases its port before the server binds it: on a busy box another process (an
xdist worker, another suite) may take it in between. Each test here holds a port the launcher
picks, as that process would, and watches the server start on another port and answer. (The
launchers that bind port 0 themselves, tests/cli/test_console_launch.py's consoles and
tests/cli/test_console_cross_site.py's site, pick nothing to take; tests/test_infra.py holds
AppServer's and RedisServer's own picks.)
"""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import TYPE_CHECKING

import httpx
import pytest

import tests._servers as servers
from idemkey.cli import main
from tests._servers import HOST
from tests.cli import test_commands
from tests.cli.conftest import Run
from tests.cluster._cluster import ClusterProcesses
from tests.frameworks import test_docs_pages

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path


@pytest.fixture
def taken_port(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A ``free_port()`` of the test (the first, or the ``request.param``-th from 0) hands out a
    port another process listens on (and never answers): every ``tests`` module's ``free_port``
    is patched, wherever it was imported."""
    real = servers.free_port
    pick: int = getattr(request, "param", 0)
    handed: list[int] = []
    with socket.create_server((HOST, 0)) as holder:
        held: int = holder.getsockname()[1]

        def free_port(host: str = HOST) -> int:
            handed.append(held if len(handed) == pick else real(host))
            return handed[-1]

        for module in list(sys.modules.values()):
            name = getattr(module, "__name__", "")
            if name.startswith("tests") and getattr(module, "free_port", None) is real:
                monkeypatch.setattr(module, "free_port", free_port)
        yield held
    assert held in handed, "the launcher did not pick that many ports with free_port()"


WSGI_APP = """
def application(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]
"""
ASGI_APP = """
async def application(scope, receive, send):
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
"""
FLASK_APP = """
from flask import Flask

app = Flask(__name__)
app.get("/")(lambda: "ok")
"""


def _served(name: str, where: Path) -> Callable[[int], list[str]]:
    """The argv, for a port, that serves a one-route app in ``where`` on the server ``name``,
    as the pages' tests start it."""
    executable = test_docs_pages.executable
    if name == "flask":
        (where / "app.py").write_text(FLASK_APP)
        return lambda port: [executable("flask"), "--app", "app", "run", "--port", str(port)]
    if name == "uvicorn":
        (where / "asgi_app.py").write_text(ASGI_APP)
        return lambda port: [executable("uvicorn"), "asgi_app:application", "--host", HOST,
                             "--port", str(port)]  # fmt: skip
    if name == "gunicorn":
        (where / "wsgi_app.py").write_text(WSGI_APP)
        return lambda port: [executable("gunicorn"), "wsgi_app:application", "--bind",
                             f"{HOST}:{port}"]  # fmt: skip
    if name == "django":
        subprocess.run([executable("django-admin"), "startproject", "site_"], cwd=where, check=True)
        return lambda port: [sys.executable, "site_/manage.py", "runserver", f"{HOST}:{port}",
                             "--noreload"]  # fmt: skip
    assert name == "idemkey serve"
    return lambda port: [sys.executable, "-m", "idemkey", "serve", "--port", str(port)]


@pytest.mark.parametrize("name", ["flask", "uvicorn", "gunicorn", "django", "idemkey serve"])
def test_a_page_server_whose_port_was_taken_starts_on_another(
    name: str, taken_port: int, tmp_path: Path
) -> None:
    """The pages' tests (tests/frameworks/test_docs_pages.py, tests/test_pages*.py) start their
    servers with ``serving``: each server says "taken" in its own words."""
    with test_docs_pages.serving(_served(name, tmp_path), tmp_path) as base:
        assert base != f"http://{HOST}:{taken_port}"
        path = "/charges" if name == "idemkey serve" else "/"  # the demo app's one GET
        assert httpx.get(base + path, timeout=10).status_code == 200


def test_a_console_whose_port_was_taken_binds_another(
    taken_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """The console binds its port before it reads --redis-url (tests/cli/test_commands.py)."""

    def idemkey(*argv: str) -> Run:  # the `idemkey` fixture of tests/cli/conftest.py
        code = main(list(argv))
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    url, shown, why = "redis://:s3cret@[::1]:-1/0", "redis://:***@[::1]:-1/0", "Port"
    test_commands.test_a_url_with_a_password_and_a_bad_port_is_a_bad_argument(
        idemkey, url, shown, why, "console"
    )


@pytest.mark.parametrize("taken_port", [0, 1], ids=["bus port", "port"], indirect=True)
def test_a_cluster_node_whose_port_was_taken_starts_on_others(
    taken_port: int, redis_server_bin: str
) -> None:
    """A node picks its cluster bus port (Redis 7+), then its own, with ``free_port()``."""
    with ClusterProcesses(masters=1, replicas=0) as cluster:
        (node,) = cluster.nodes
        assert node.running
        assert taken_port not in (node.port, cluster._bus_ports[node])
        client = cluster.client()
        try:
            assert client.set("k", b"v")
            assert client.get("k") == b"v"
        finally:
            client.close()
