"""The Flask app (with the extension) that test_flask_servers.py serves with gunicorn, waitress
and werkzeug: views whose outcome is only known once the response leaves Flask.

``IDEMKEY_TEST_REDIS_URL`` and ``IDEMKEY_TEST_PREFIX`` come from the environment. The server
runs in another process, so every view counts its runs in Redis (``INCR
{prefix}:runs:<key>``), where the test reads them. Werkzeug's own server, threaded as
``flask run`` uses it: ``python -m tests.adapters.flask_settle_app <port>``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import redis
from flask import Flask, Response, g, request, send_file

from idemkey.adapters.flask import Idemkey

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

idem = Idemkey()
RECEIPT = b"receipt\n" * 10


def create_app() -> Flask:
    url, prefix = os.environ["IDEMKEY_TEST_REDIS_URL"], os.environ["IDEMKEY_TEST_PREFIX"]
    app = Flask(__name__)
    app.config.update(IDEMKEY_REDIS_URL=url, IDEMKEY_PREFIX=prefix, IDEMKEY_LEASE=10.0)
    idem.init_app(app)
    counter = redis.Redis.from_url(url)
    app.wsgi_app = noting_file_wrapper(app.wsgi_app, counter, prefix)  # type: ignore[method-assign]
    receipt = os.path.join(tempfile.mkdtemp(prefix="idemkey-receipt-"), "receipt.txt")
    with open(receipt, "wb") as out:
        out.write(RECEIPT)

    def run() -> int:
        return int(counter.incr(f"{prefix}:runs:{request.headers['Idempotency-Key']}"))

    @app.get("/health")
    def health() -> str:
        return "ok"

    @app.after_request
    def commit_and_decorate(response: Response) -> Response:
        key = request.headers.get("Idempotency-Key", "")
        if g.get("unit_of_work") and response.status_code < 400:
            # The view's unit of work, committed after it (a SQLAlchemy session), which fails
            # the first time (a deadlock), and is done the next; a replay has none.
            if counter.set(f"{prefix}:failed-once:{key}", 1, nx=True):
                raise RuntimeError("deadlock detected; transaction rolled back")
            counter.incr(f"{prefix}:committed:{key}")
        elif request.path == "/envelope":
            response.set_data(json.dumps({"data": response.get_json()}).encode())
            response.add_etag()
        return response

    @app.post("/commit-fails-once")
    @app.post("/envelope")
    @idem.idempotent
    def charge() -> Any:
        g.unit_of_work = request.path == "/commit-fails-once"
        return {"id": "ch_1", "run": run()}, 201

    @app.post("/receipt")
    @idem.idempotent
    def file() -> Any:
        run()
        return send_file(receipt, mimetype="text/plain")

    def rows(fail_after: int | None) -> Iterator[bytes]:
        for n in range(3):
            if n == fail_after:
                raise ConnectionError("upstream down")
            yield b"row %d\n" % n

    @app.post("/export")
    @idem.idempotent
    def export() -> Any:
        run()
        fail = request.args.get("fail_after")
        return Response(rows(None if fail is None else int(fail)), 201, mimetype="text/csv")

    @app.post("/report")
    @idem.idempotent
    def report() -> Any:
        run()
        lines: list[Any] = ["id,amount\n", "ch_1,1000\n"]
        if request.args.get("as") == "bytes":
            lines = [line.encode() for line in lines]
        return Response(lines, status=201, mimetype="text/csv")

    return app


def noting_file_wrapper(app: WSGIApplication, counter: redis.Redis, prefix: str) -> Any:
    """``app`` (Flask's WSGI app, with the extension's layer), counting in Redis (``INCR
    {prefix}:file-wrapper:<key>``) each answer the server gets as its own ``wsgi.file_wrapper``
    object, which it sends with ``sendfile`` (gunicorn) or its file buffer (waitress)."""

    def noted(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        body = app(environ, start_response)
        wrapper = environ.get("wsgi.file_wrapper")
        if isinstance(wrapper, type) and isinstance(body, wrapper):
            counter.incr(f"{prefix}:file-wrapper:{environ.get('HTTP_IDEMPOTENCY_KEY')}")
        return body

    return noted


if __name__ == "__main__":  # werkzeug's development server, threaded, as `flask run` uses it
    from werkzeug.serving import run_simple

    run_simple("127.0.0.1", int(sys.argv[1]), create_app(), threaded=True)
