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

A reader tries the pages one after another against the one Redis they all name, so every served
sample is also served in turn on one shared redis-server, twice over: each page's printed
``curl`` gets the answer the page prints (a 201, never another page's record), and the second
round replays it (:func:`test_the_samples_served_in_turn_on_one_redis_keep_their_records`).
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
from typing import NamedTuple

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


class Sample(NamedTuple):
    """A served sample: its page, the serve command it prints, the one file it needs of the
    page's (``None``: all), and the prefix its settings name (one per sample: they share the
    Redis the pages name, so no two may share a record)."""

    page: Path
    command: str
    only: str | None
    prefix: str


SAMPLES = {
    "README.md": Sample(ROOT / "README.md", "flask --app app run", "app.py", "payments"),
    "flask.md": Sample(ROOT / "docs/flask.md", "flask --app app run", None, "flask-payments"),
    "fastapi.md": Sample(ROOT / "docs/fastapi.md", "uvicorn app:app", None, "fastapi-payments"),
    "starlette.md": Sample(
        ROOT / "docs/starlette.md", "uvicorn app:app", None, "starlette-payments"
    ),
    "django.md": Sample(
        ROOT / "docs/django.md", "python manage.py runserver", None, "django-payments"
    ),
    "wsgi-asgi.md": Sample(
        ROOT / "docs/wsgi-asgi.md", "gunicorn app:application", "app.py", "wsgi-payments"
    ),
    "wsgi-asgi.md ASGI": Sample(
        ROOT / "docs/wsgi-asgi.md", "uvicorn asgi_app:application", "asgi_app.py", "asgi-payments"
    ),
}
#: What each server program is told of the port (and host) to serve on.
ON_PORT: dict[str, Callable[[int], list[str]]] = {
    "flask": lambda port: ["--port", str(port)],
    "uvicorn": lambda port: ["--host", HOST, "--port", str(port)],
    "gunicorn": lambda port: ["--bind", f"{HOST}:{port}"],
    "python": lambda port: [f"{HOST}:{port}", "--noreload"],  # manage.py runserver
}


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


def retries_behave(base: str, url: str, path: str, *, scope: str, prefix: str) -> None:
    """First call, replay, 422 on another body, 409 while a claim holds the key, 400 without;
    the record under ``prefix``, the one the page's settings name."""
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
            done = record_for(prefix, scope, "POST", path, "k-first")
            stored = client.hget(done.key, "fp")  # the fingerprint + the completer's 12-char tag
            assert stored, "the first call's record is not where the page's settings put it"
            fp = stored[:-12]
            holder = RedisStore(client, Policy(prefix=prefix))
            record = record_for(prefix, scope, "POST", path, "k-held")
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


def set_up(
    name: str, where: Path, url: str, bin_dir: Path | None = None
) -> tuple[Path, Callable[[int], list[str]]]:
    """The sample ``name`` (:data:`SAMPLES`) saved in ``where`` as its page says (Django's in
    the project the page creates), on the Redis at ``url``; the directory to serve it from, and
    its printed serve command on a port, run from ``bin_dir`` (unless told: this environment)."""
    sample = SAMPLES[name]

    def program(word: str) -> str:
        if bin_dir is not None:
            return str(bin_dir / word)
        return sys.executable if word == "python" else executable(word)

    if sample.page.name == "django.md":
        startproject = printed(sample.page, "django-admin startproject mysite")
        subprocess.run([program("django-admin"), *startproject[1:]], cwd=where, check=True)
        assert "cd mysite" in bash_lines(sample.page)
        where = where / "mysite"
    write_files(sample.page, where, url, only=sample.only)
    command = printed(sample.page, sample.command)
    serve = [program(command[0]), *command[1:]]
    return where, lambda port: [*serve, *ON_PORT[command[0]](port)]


def test_flask_page_on_flask_run(url: str, tmp_path: Path) -> None:
    installs(page("flask.md"), "flask")
    where, argv = set_up("flask.md", tmp_path, url)
    with serving(argv, where) as base:
        retries_behave(base, url, "/charges", scope=NO_CREDENTIALS, prefix="flask-payments")
    with serving(argv, where) as base:  # run again, same Redis
        replays_on_a_second_run(base, "/charges")


def test_readme_example_on_flask_run(url: str, tmp_path: Path) -> None:
    installs(ROOT / "README.md", "flask")
    where, argv = set_up("README.md", tmp_path, url)
    with serving(argv, where) as base:
        retries_behave(base, url, "/charges", scope=NO_CREDENTIALS, prefix="payments")
    with serving(argv, where) as base:  # run again, same Redis
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
    installs(page(name), name.removesuffix(".md"))
    where, argv = set_up(name, tmp_path, url)
    with serving(argv, where) as base:
        retries_behave(base, url, "/charges", scope=NO_CREDENTIALS, prefix=SAMPLES[name].prefix)
        with httpx.Client(base_url=base) as http:
            assert http.post("/login").status_code == 200  # not guarded: no key needed
    with serving(argv, where) as base:  # run again, same Redis
        replays_on_a_second_run(base, "/charges")


def test_django_page_in_a_new_project_on_runserver(url: str, tmp_path: Path) -> None:
    installs(page("django.md"), "django")
    project, argv = set_up("django.md", tmp_path, url)
    with serving(argv, project) as base:
        retries_behave(base, url, "/charges", scope=NO_CREDENTIALS, prefix="django-payments")
        with httpx.Client(base_url=base) as http:
            assert http.post("/webhook").status_code == 200  # exempt, and no CSRF 403
    with serving(argv, project) as base:  # run again, same Redis
        replays_on_a_second_run(base, "/charges")


def test_wsgi_page_on_gunicorn(url: str, tmp_path: Path) -> None:
    installs(page("wsgi-asgi.md"), None)
    where, argv = set_up("wsgi-asgi.md", tmp_path, url)
    with serving(argv, where) as base:
        retries_behave(base, url, "/charges", scope=NO_CREDENTIALS, prefix="wsgi-payments")
        with httpx.Client(base_url=base) as http:
            assert http.post("/v1/login").status_code == 201  # exempt
            assert http.post("/v1/anything").status_code == 400  # guarded by /v1/{rest:path}
            assert http.post("/elsewhere").status_code == 201  # no route: not guarded
    with serving(argv, where) as base:  # run again, same Redis
        replays_on_a_second_run(base, "/charges")


def test_asgi_page_on_uvicorn(url: str, tmp_path: Path) -> None:
    # Only asgi_app.py is saved: the ASGI file stands alone, no name from the WSGI one.
    where, argv = set_up("wsgi-asgi.md ASGI", tmp_path, url)
    with serving(argv, where) as base:
        retries_behave(base, url, "/charges", scope=NO_CREDENTIALS, prefix="asgi-payments")
        with httpx.Client(base_url=base) as http:
            assert http.post("/v1/login").status_code == 201  # exempt
            assert http.post("/elsewhere").status_code == 201  # no route: not guarded
    with serving(argv, where) as base:  # run again, same Redis
        replays_on_a_second_run(base, "/charges")


class Exchange(NamedTuple):
    """A ``$ curl`` of a page's console block and the answer lines it prints under it."""

    command: str
    answer: list[str]


def console_exchanges(path: Path) -> list[Exchange]:
    """The page's ```console exchanges; ``$ # the same request again`` repeats the last curl."""
    exchanges: list[Exchange] = []
    for block in re.findall(r"```console\n(.*?)```", path.read_text("utf-8"), re.S):
        for command, answer in re.findall(r"^\$ ((?:.*\\\n)*.*)\n((?:(?!\$ ).*\n)*)", block, re.M):
            if command.startswith("#"):
                command = exchanges[-1].command
            assert command.startswith("curl "), (path.name, command)
            exchanges.append(Exchange(command, answer.splitlines()))
    return exchanges


def send(http: httpx.Client, command: str) -> httpx.Response:
    """The printed ``curl`` command, sent to ``http``'s server; only the flags the pages use."""
    words = shlex.split(command.replace("\\\n", " "))[1:]
    method, target, headers, body = "GET", "", {}, None
    while words:
        word = words.pop(0)
        if word == "-X":
            method = words.pop(0)
        elif word == "-H":
            name, value = words.pop(0).split(": ", 1)
            headers[name] = value
        elif word == "-d":
            body = words.pop(0)
        elif word != "-i":
            assert not word.startswith("-"), f"a curl flag to read: {word}"
            assert not target, f"a second URL: {word}"
            target = "/" + word.split("/", 1)[1]  # localhost:8000/charges: the path
    return http.request(method, target, headers=headers, content=body)


def answers_as_printed(response: httpx.Response, printed_lines: list[str]) -> None:
    """The status line, the header lines and the body the page prints (``...``: lines left out);
    no ``Idempotent-Replayed`` where the page prints none."""
    status_line, *rest = printed_lines
    actual = f"{response.http_version} {response.status_code} {response.reason_phrase}"
    assert actual == status_line, response.text
    for line in (line for line in rest if line not in ("", "...")):
        if line.startswith("{"):
            assert response.text == line
        else:
            name, value = line.split(": ", 1)
            assert response.headers.get(name) == value, (line, dict(response.headers))
    if not any(line.startswith("Idempotent-Replayed:") for line in rest):
        assert "Idempotent-Replayed" not in response.headers, response.headers


@pytest.mark.redis
def test_the_samples_served_in_turn_on_one_redis_keep_their_records(
    url: str, tmp_path: Path
) -> None:
    """Every served sample on one Redis, one after another, as a reader trying the pages does:
    each page's printed curl gets the answers the page prints, and the same request again a
    replay of its own first answer (a page that prints no curl gets the FastAPI page's, the
    request a reader copies), never another page's record or a 422. Then each sample served
    again: its request replays its own first answer."""
    assert len({sample.prefix for sample in SAMPLES.values()}) == len(SAMPLES)
    borrowed = console_exchanges(SAMPLES["fastapi.md"].page)[0].command
    served: dict[str, tuple[Path, Callable[[int], list[str]]]] = {}
    for i, name in enumerate(SAMPLES):
        (tmp_path / str(i)).mkdir()
        served[name] = set_up(name, tmp_path / str(i), url)
    first: dict[str, httpx.Response] = {}
    for name in [*SAMPLES, *SAMPLES]:
        exchanges = console_exchanges(SAMPLES[name].page)
        request = exchanges[0].command if exchanges else borrowed
        where, argv = served[name]
        with serving(argv, where) as base, httpx.Client(base_url=base) as http:
            if name not in first and exchanges:
                first[name] = send(http, exchanges[0].command)
                answers_as_printed(first[name], exchanges[0].answer)
                for exchange in exchanges[1:]:
                    answers_as_printed(send(http, exchange.command), exchange.answer)
            elif name not in first:
                first[name] = send(http, request)
                assert first[name].status_code == 201, (name, first[name].text)
                assert "Idempotent-Replayed" not in first[name].headers, name
            again = send(http, request)
        assert again.status_code == 201, (name, again.text)
        assert again.headers.get("Idempotent-Replayed") == "true", name
        assert again.content == first[name].content, name
