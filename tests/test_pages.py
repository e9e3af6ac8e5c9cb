"""The pages' samples run as printed: docs/guard.md, client.md, effects.md, testing.md here;
docs/steps.md in tests/steps/test_docs.py, docs/queues.md in tests/contrib/test_queues_page.py
and docs/behaviour.md in tests/test_behaviour_page.py.

See :mod:`tests._pages` for what "as printed" means: each python block runs alone, in an empty
namespace, with only its Redis URL pointed at the test's private redis-server. guard.md and
client.md run twice (:func:`tests._pages.run_twice`), as a reader runs a sample twice: the
second run must print its replay, not fail on what the first run stored.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from idemkey.http import _scope as http_scope
from tests._pages import PAGES, ROOT, blocks, run_page, run_twice, write_page
from tests._servers import RedisServer, free_port, user_environ


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_of_the_page_is_marked_and_a_test_runs_the_page(page: str) -> None:
    assert blocks(page)  # every python block follows <!-- run --> (else an AssertionError)
    runners = [
        path
        for path in (ROOT / "tests").rglob("*.py")
        if re.search(
            rf"(run_page|write_page|run_twice)\(\s*\"{re.escape(page)}\"", path.read_text("utf-8")
        )
    ]
    assert runners, f"no test calls run_page({page!r}) or write_page({page!r})"


def test_an_unmarked_python_block_fails_the_check(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- run -->\n```python\nx = 1\n```\n\n```python\ny = 2\n```\n")
    with pytest.raises(AssertionError, match="not marked"):
        blocks(str(page))  # an absolute path: ROOT / page is page


@pytest.fixture
def url(private_redis_server: RedisServer) -> str:
    return private_redis_server.url


@pytest.mark.redis
def test_guard_page(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    (first, _, _, decorator), (rerun, _, _, redecorated) = run_twice("docs/guard.md", url)
    assert first["psp"].charged == [1000]  # the block's own assertion held; once more here
    assert first["handle"](first["job"]) == {"charge_id": "ch_1"}
    assert first["psp"].charged == [1000]
    assert rerun["psp"].charged == []  # run again: every call a replay
    out = capsys.readouterr().out.splitlines()
    replayed = "{'refunded': 500}"
    assert out == [
        *["{'charge_id': 'ch_1'}"] * 2,
        "charged by this run: [1000]",
        f"replayed: False {replayed}",
        out[4],
        "(['welcome mail to user 7'], [False, True])",
        out[6],
        "charged by this run: ['inv-2002']",
        # The program run again against the same Redis: the same answers, nothing done.
        *["{'charge_id': 'ch_1'}"] * 2,
        "charged by this run: []",
        f"replayed: True {replayed}",
        out[12],
        "([], [True, True])",
        out[14],
        "charged by this run: []",
    ]
    assert out[4].startswith("refused: ")
    assert out[12] == out[4]
    receipt = "Receipt(invoice='inv-2002', charge_id='ch_1')"
    assert out[6] == out[14] == f"{receipt} {receipt}"
    for namespace in (decorator, redecorated):
        assert type(namespace["again"]).__name__ == "Receipt"
    assert decorator["charges"] == ["inv-2002"]
    assert redecorated["charges"] == []


@pytest.mark.redis
def test_effects_page(
    private_redis_server: RedisServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Both samples run as printed, twice (the second run replays from Redis), then once more
    after Redis restarted with nothing kept (replayed from the database): the same output, and
    no warning (the HTTP sample sends a credential, as the page tells a service to)."""
    pytest.importorskip("sqlalchemy")
    monkeypatch.chdir(tmp_path)  # the samples write shop.db and orders.db here
    charge_out = ["{'invoice': 'inv-3003'}"] * 2 + ["1"]
    order_out = ["201 {'order': 1, 'sku': 'tea'}"] * 2 + ["1"]
    # The warning of a request without credentials is logged once per process: let this
    # test see whether the page's requests would log it (they carry a credential).
    monkeypatch.setattr(http_scope, "_warned", False)
    for run in ("first", "second", "after a restart"):
        if run == "after a restart":
            private_redis_server.restart()
        charges, orders = run_page("docs/effects.md", private_redis_server.url)
        try:
            assert capsys.readouterr().out.splitlines() == charge_out + order_out, run
            warned = [r.getMessage() for r in caplog.records if "no credential" in r.getMessage()]
            assert warned == [], run
            # The charge's result was committed into idemkey_effects with the business row.
            with charges["Session"](charges["engine"]) as session:
                rows = session.execute(charges["effects"].table.select()).all()
            assert len(rows) == 1
            assert rows[0].result is not None
            with orders["Session"](orders["engine"]) as session:  # the response, recorded
                (row,) = session.execute(orders["effects"].table.select()).all()
            assert b"tea" in row.result
        finally:
            charges["engine"].dispose()
            orders["engine"].dispose()
            for block in (charges, orders):
                block["store"].close()
                block["store"].client.close()  # the sample's client: a program's ends with it


@pytest.fixture
def demo_server(url: str, tmp_path: Path) -> Iterator[str]:
    """``idemkey serve`` on a free port, its records in the test's redis-server."""
    pytest.importorskip("httpx")  # serving()'s module needs it; the other pages need no httpx
    from tests.frameworks.test_docs_pages import serving

    def serve(port: int) -> list[str]:
        return [sys.executable, "-m", "idemkey", "serve", "--port", str(port), "--redis-url", url]

    with serving(serve, tmp_path) as base:
        yield base


@pytest.mark.redis
def test_client_page(demo_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("httpx")
    (sync, *_), (resync, *_) = run_twice(
        "docs/client.md", replace={"http://127.0.0.1:8000": demo_server}
    )
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 15, out
    key, first, again, refused, async_line, plain, paid, already = out[:8]
    charge_id = sync["reply"].json()["id"]
    assert key == f"key: {sync['operation'].key}"
    assert first == f"201 {charge_id} False 1"
    assert again == f"201 {charge_id} True"
    assert refused == "key_reused"
    assert async_line == "201 False True"
    status, key_sent = plain.split()
    assert status == "201"
    assert key_sent  # the transport gave the plain httpx POST a key
    assert paid.startswith("paid: ")
    assert already == f"already paid: {paid.removeprefix('paid: ')}"  # on_replay="refuse"
    # Run again against the same server and Redis: a new operation (a new random key) runs,
    # the fixed keys (job-42, order-77) replay, and the refused replay is caught, never raised.
    key, first, again, refused, async_line, plain, already_again = out[8:]
    charge_id = resync["reply"].json()["id"]
    assert key == f"key: {resync['operation'].key}" != out[0]
    assert (first, again) == (f"201 {charge_id} False 1", f"201 {charge_id} True")
    assert refused == "key_reused"
    assert async_line == "201 True True"
    assert plain.startswith("201 ")
    assert already_again == already  # no "paid:" line: the first attempt was a replay


def test_the_client_errors_name_their_public_module() -> None:
    pytest.importorskip("httpx")
    import idemkey.client

    names = ("RetriesExhaustedError", "UnexpectedReplayError", "UnusableAnswerError")
    for name in ("ClientError", "RefusedError", *names):
        assert getattr(idemkey.client, name).__module__ == "idemkey.client"


def test_testing_page(tmp_path: Path) -> None:
    pytest.importorskip("fakeredis")
    pytest.importorskip("flask")
    # The app's own Redis URL points at a port nothing listens on: only the kit's stores answer.
    files = write_page("docs/testing.md", tmp_path, redis_url=f"redis://127.0.0.1:{free_port()}")
    assert [f.name for f in files] == ["app.py", "conftest.py", "test_charges.py"]
    env = user_environ(PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    env.pop("IDEMKEY_REDIS_URL", None)  # the sample's tests need no Redis
    # The page's install line brings no pytest-asyncio (tests/test_pages_fresh.py runs the page
    # where only that line is installed): as printed, the run is clean without it. With it, the
    # option the page names is what keeps pytest-asyncio 1.x from failing the run.
    option = "asyncio_default_fixture_loop_scope = function"
    assert f"`{option}`" in (ROOT / "docs/testing.md").read_text("utf-8")
    pytest_run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"]
    for plugin in (["-p", "no:asyncio"], ["-o", option.replace(" = ", "=")]):
        done = subprocess.run(
            [*pytest_run, *plugin],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.search(r"^3 passed in [\d.]+s$", done.stdout, re.M), done.stdout
