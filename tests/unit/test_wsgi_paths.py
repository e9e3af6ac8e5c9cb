"""A WSGI request's path as idemkey reads it: the text an ASGI server gives for the same request.

PEP 3333 hands ``PATH_INFO`` (and ``SCRIPT_NAME``) over as the path's bytes, percent-decoded,
as latin-1 text: ``/cafés`` arrives as ``/cafÃ©s``. Read as it came, the path named another
record and fingerprinted another way than the same request behind an ASGI server, whose
``scope["path"]`` is text (a retry crossing deployments ran again, or was 422 under Flask).
"""

from __future__ import annotations

from typing import Any

import pytest

from idemkey import Policy
from idemkey.adapters._environ import request_of
from idemkey.http import Exchange, Headers, Request, begin


def environ(path: str, script: str = "") -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "POST", "SCRIPT_NAME": script, "PATH_INFO": path, "QUERY_STRING": "a=1",
        "CONTENT_TYPE": "application/json", "HTTP_IDEMPOTENCY_KEY": "k",
    }  # fmt: skip


def pep3333(path: str) -> str:
    return path.encode("utf-8").decode("latin-1")


#: PATH_INFO as each server gives it -> the path an ASGI server gives for that request.
#: A path that is not UTF-8 (``/caf%E9s``): gunicorn, waitress and granian give its byte,
#: werkzeug's server the UTF-8 of U+FFFD; uvicorn, hypercorn, daphne and granian's ASGI
#: interface decode it with U+FFFD.
AS_ASGI_GIVES = {
    pep3333("/cafés"): "/cafés",
    pep3333("/menüs/thé/€"): "/menüs/thé/€",
    "/caf\xe9s": "/caf\ufffds",
    pep3333("/caf\ufffds"): "/caf\ufffds",
    "/charges": "/charges",
}


@pytest.mark.parametrize("path_info", list(AS_ASGI_GIVES))
def test_a_wsgi_path_reads_as_the_asgi_path_of_the_same_request(path_info: str) -> None:
    assert request_of(environ(path_info)).path == AS_ASGI_GIVES[path_info]


def test_the_script_name_is_read_with_the_path() -> None:
    assert request_of(environ(pep3333("/thé"), pep3333("/café"))).path == "/café/thé"


def test_a_path_that_is_no_pep_3333_text_is_kept_as_it_is() -> None:
    # A hand-built environ with a character past latin-1 cannot be bytes as latin-1.
    assert request_of(environ("/caf\u20ac")).path == "/caf\u20ac"


def guarded(request: Request) -> Exchange:
    exchange = begin(Policy(), request)
    assert isinstance(exchange, Exchange)
    return exchange


@pytest.mark.parametrize("path_info", list(AS_ASGI_GIVES))
def test_one_request_names_one_record_and_fingerprint_under_wsgi_and_asgi(path_info: str) -> None:
    wsgi = guarded(request_of(environ(path_info)))
    headers = Headers([("content-type", "application/json"), ("idempotency-key", "k")])
    asgi = guarded(Request("POST", AS_ASGI_GIVES[path_info], "a=1", headers))
    assert wsgi.record == asgi.record
    assert wsgi.route == asgi.route == AS_ASGI_GIVES[path_info]
    assert wsgi.fingerprint(b"{}") == asgi.fingerprint(b"{}")
