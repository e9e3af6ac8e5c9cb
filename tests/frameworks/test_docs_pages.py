"""Every integration page of the docs site runs as copied, over real HTTP on the server it names.

For each page (docs/flask.md, fastapi.md, starlette.md, django.md, wsgi-asgi.md, and
README.md's one HTTP example), the ```python blocks are written to the files their first line
names (``# app.py``; ``# mysite/settings.py (add at the end)`` is appended), exactly as
printed: only the Redis URL is replaced, by a private real redis-server's. The page's serve
command (checked to be printed on the page) starts the real server it names, on a free port
(``AppServer``: again on a fresh one if another process took it), in a fresh directory; then
over real HTTP: the first call runs, the same request replays, the same key with another body
is 422, a retry while a claim holds the key is 409, and a request without a key is 400. The
install line names the page's extra, which pyproject.toml declares.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from idemkey import Policy, RedisStore
from idemkey._core import record_for
from idemkey.http._scope import NO_CREDENTIALS
from scripts.mkdocs_hooks import expand_install
from tests._servers import HOST, AppServer, RedisServer

ROOT = Path(__file__).resolve().parents[2]
DOCS_URL = "redis://localhost:6379/0"
FILE_LINE = re.compile(r"# (?P<path>[\w/.]+\.py)(?P<append> \(add at the end\))?\n")


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text("utf-8"), re.S)


def bash_lines(page: Path) -> list[str]:
    """The lines of the page's ```bash blocks, as the site shows them (install lines
    expanded by scripts/mkdocs_hooks.py)."""
    blocks = re.findall(r"```bash\n(.*?)```", expand_install(page.read_text("utf-8")), re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def write_files(page: Path, where: Path, url: str, only: str | None = None) -> None:
    """Each file-named python block of ``page`` (or only the one for ``only``) into ``where``,
    with the Redis URL replaced."""
    written = 0
    for block in python_blocks(page):
        named = FILE_LINE.match(block)
        if named is None or only not in (None, named["path"]):
            continue
        target = where / named["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        code = block.replace(DOCS_URL, url)
        if named["append"]:
            code = target.read_text("utf-8") + "\n" + code
        target.write_text(code, "utf-8")
        written += 1
    assert written, f"{page.name} has no ```python block naming its file"


def installs(page: Path, extra: str | None) -> None:
    """The page's pip line installs this project with ``extra``, which pyproject declares."""
    lines = [line for line in bash_lines(page) if line.startswith("pip install")]
    assert lines, f"{page.name} has no pip install line"
    wanted = f"pip install -e '.[{extra}]'" if extra else "pip install -e ."
    assert any(line.startswith(wanted) for line in lines), (page.name, lines)
    if extra:  # a plain scan: Python 3.10 has no tomllib
        assert f"\n{extra} = [" in (ROOT / "pyproject.toml").read_text("utf-8"), extra


@contextlib.contextmanager
def serving(
    command: Callable[[int], list[str]], cwd: Path, pythonpath: tuple[Path, ...] = (ROOT,)
) -> Iterator[str]:
    """The server ``command(port)`` runs in ``cwd`` on a free port until it answers (with
    anything: the pages' apps have no health route); stopped after. Its imports come from
    ``cwd`` and ``pythonpath`` (this checkout, unless told)."""
    env = {"PYTHONPATH": os.pathsep.join(map(str, (cwd, *pythonpath)))}
    name = Path(command(0)[0]).name
    log = cwd / "server.log"
    with AppServer(command, log=log, cwd=cwd, env=env, name=name, health=None) as server:
        yield server.url


def executable(name: str) -> str:
    found = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed")
    return found


def retries_behave(base: str, url: str, path: str, *, scope: str, json_body: bool = True) -> None:
    """First call, replay, 422 on another body, 409 while a claim holds the key, 400 without."""
    body: dict[str, object] = {"amount": 5}
    key = {"Idempotency-Key": "k-first"}
    with httpx.Client(base_url=base, timeout=10.0) as http:
        first = http.post(path, json=body, headers=key)
        again = http.post(path, json=body, headers=key)
        assert first.status_code == 201, first.text
        assert (again.status_code, again.content) == (201, first.content)
        assert again.headers["Idempotent-Replayed"] == "true"
        assert "Idempotent-Replayed" not in first.headers
        other = http.post(path, json={"amount": 6}, headers=key)
        assert (other.status_code, other.json()["code"]) == (422, "key_reused"), other.text
        assert http.post(path, json=body).json()["code"] == "missing_key"
        # The same request holds another key (its claim is live): a retry is told to come back.
        client = redis.Redis.from_url(url)
        try:
            done = record_for("payments", scope, "POST", path, "k-first")
            stored = client.hget(done.key, "fp")  # the fingerprint + the completer's 12-char tag
            assert stored, "the first call's record is not where the page's settings put it"
            fp = stored[:-12]
            holder = RedisStore(client, Policy(prefix="payments"))
            record = record_for("payments", scope, "POST", path, "k-held")
            holder.claim(record, fp, lease_ms=60_000, heartbeat=False)
            held = http.post(path, json=body, headers={"Idempotency-Key": "k-held"})
        finally:
            client.close()
        assert (held.status_code, held.json()["code"]) == (409, "in_flight"), held.text
        assert held.headers["Retry-After"]


def replays_on_a_second_run(base: str, path: str) -> None:
    """The page's server started again on the same Redis (a reader running the sample
    twice): the first run's request is answered from Redis, never run again."""
    with httpx.Client(base_url=base, timeout=10.0) as http:
        again = http.post(path, json={"amount": 5}, headers={"Idempotency-Key": "k-first"})
    assert again.status_code == 201, again.text
    assert again.headers["Idempotent-Replayed"] == "true"


@pytest.fixture
def url(private_redis_server: RedisServer) -> str:
    return private_redis_server.url


def page(name: str) -> Path:
    return ROOT / "docs" / name


def printed(path: Path, command: str) -> list[str]:
    """``command`` as a list, after checking the page prints it on a line of its own."""
    assert command in bash_lines(path), f"{path.name} does not print {command!r}"
    return shlex.split(command)


def test_flask_page_on_flask_run(url: str, tmp_path: Path) -> None:
    path = page("flask.md")
    installs(path, "flask")
    write_files(path, tmp_path, url)
    command = printed(path, "flask --app app run")
    flask = executable("flask")

    def argv(port: int) -> list[str]:
        return [flask, *command[1:], "--port", str(port)]

    with serving(argv, tmp_path) as base:
        retries_behave(base, url, "/charges", scope=NO_CREDENTIALS)
    with serving(argv, tmp_path) as base:  # run again, same Redis
        replays_on_a_second_run(base, "/charges")


def test_readme_example_on_flask_run(url: str, tmp_path: Path) -> None:
    path = ROOT / "README.md"
    installs(path, "flask")
    write_files(path, tmp_path, url, only="app.py")
    command = printed(path, "flask --app app run")
    flask = executable("flask")

    def argv(port: int) -> list[str]:
        return [flask, *command[1:], "--port", str(port)]

    with serving(argv, tmp_path) as base:
        retries_behave(base, url, "/charges", scope=NO_CREDENTIALS)
    with serving(argv, tmp_path) as base:  # run again, same Redis
        replays_on_a_second_run(base, "/charges")


def test_flask_page_app_factory_takes_a_test_store(url: str, tmp_path: Path) -> None:
    """The test kit's `create_app(store=idemkey_store)` works with the page's factory."""
    from idemkey.testing import fake_store

    namespace: dict[str, object] = {"__name__": "docs_flask_app"}
    (code,) = python_blocks(page("flask.md"))
    exec(compile(code.replace(DOCS_URL, url), "docs/flask.md", "exec"), namespace)
    store = fake_store()
    app = namespace["create_app"](store=store)  # type: ignore[operator]
    assert app.extensions["idemkey"].store is store
    client = app.test_client()
    headers = {"Idempotency-Key": "k"}
    assert client.post("/charges", json={"amount": 5}, headers=headers).status_code == 201
    again = client.post("/charges", json={"amount": 5}, headers=headers)
    assert again.headers["Idempotent-Replayed"] == "true"
    store.client.close()


@pytest.mark.parametrize("name", ["fastapi.md", "starlette.md"])
def test_asgi_framework_page_on_uvicorn(name: str, url: str, tmp_path: Path) -> None:
    path = page(name)
    if name == "fastapi.md":  # the page shows the request run, then replayed
        console = re.findall(r"```console\n(.*?)```", path.read_text("utf-8"), re.S)[0]
        first, again = console.split("$ curl")[1:]
        assert first.split("HTTP/1.1")[0] == again.split("HTTP/1.1")[0]  # the same command
        assert "Idempotent-Replayed: true" in again
        assert "Idempotent-Replayed" not in first
    installs(path, name.removesuffix(".md"))
    write_files(path, tmp_path, url)
    command = printed(path, "uvicorn app:app")
    uvicorn = executable("uvicorn")

    def argv(port: int) -> list[str]:
        return [uvicorn, *command[1:], "--host", HOST, "--port", str(port)]

    with serving(argv, tmp_path) as base:
        retries_behave(base, url, "/charges", scope=NO_CREDENTIALS)
        with httpx.Client(base_url=base) as http:
            assert http.post("/login").status_code == 200  # not guarded: no key needed
    with serving(argv, tmp_path) as base:  # run again, same Redis
        replays_on_a_second_run(base, "/charges")


def test_django_page_in_a_new_project_on_runserver(url: str, tmp_path: Path) -> None:
    path = page("django.md")
    installs(path, "django")
    startproject = printed(path, "django-admin startproject mysite")
    subprocess.run([executable("django-admin"), *startproject[1:]], cwd=tmp_path, check=True)
    assert "cd mysite" in bash_lines(path)
    project = tmp_path / "mysite"
    write_files(path, project, url)
    command = printed(path, "python manage.py runserver")

    def argv(port: int) -> list[str]:
        return [sys.executable, *command[1:], f"{HOST}:{port}", "--noreload"]

    with serving(argv, project) as base:
        retries_behave(base, url, "/charges", scope=NO_CREDENTIALS)
        with httpx.Client(base_url=base) as http:
            assert http.post("/webhook").status_code == 200  # exempt, and no CSRF 403
    with serving(argv, project) as base:  # run again, same Redis
        replays_on_a_second_run(base, "/charges")


def test_wsgi_page_on_gunicorn(url: str, tmp_path: Path) -> None:
    path = page("wsgi-asgi.md")
    installs(path, None)
    write_files(path, tmp_path, url)
    command = printed(path, "gunicorn app:application")
    gunicorn = executable("gunicorn")

    def argv(port: int) -> list[str]:
        return [gunicorn, *command[1:], "--bind", f"{HOST}:{port}"]

    with serving(argv, tmp_path) as base:
        retries_behave(base, url, "/charges", scope=NO_CREDENTIALS)
        with httpx.Client(base_url=base) as http:
            assert http.post("/v1/login").status_code == 201  # exempt
            assert http.post("/v1/anything").status_code == 400  # guarded by /v1/{rest:path}
            assert http.post("/elsewhere").status_code == 201  # no route: not guarded
    with serving(argv, tmp_path) as base:  # run again, same Redis
        replays_on_a_second_run(base, "/charges")


def test_asgi_page_on_uvicorn(url: str, tmp_path: Path) -> None:
    path = page("wsgi-asgi.md")
    write_files(path, tmp_path, url)
    command = printed(path, "uvicorn asgi_app:application")
    uvicorn = executable("uvicorn")

    def argv(port: int) -> list[str]:
        return [uvicorn, *command[1:], "--host", HOST, "--port", str(port)]

    (tmp_path / "app.py").unlink()  # the ASGI file stands alone: no name from the WSGI one
    with serving(argv, tmp_path) as base:
        retries_behave(base, url, "/charges", scope=NO_CREDENTIALS)
        with httpx.Client(base_url=base) as http:
            assert http.post("/v1/login").status_code == 201  # exempt
            assert http.post("/elsewhere").status_code == 201  # no route: not guarded
    with serving(argv, tmp_path) as base:  # run again, same Redis
        replays_on_a_second_run(base, "/charges")
