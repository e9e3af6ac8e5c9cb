"""The Flask extension's responses: a view's answer as Flask builds it, and idemkey's own
answers (a problem, a replay) as Flask responses carrying exactly the stored headers.

Kept apart from ``flask.py``, whose ``_guard`` only takes a request through the exchange.
Both run on every guarded request, so they cost as few Python calls as werkzeug allows: a
replay is one Redis round trip, and building its response the usual way (werkzeug checks
and copies each header in Python, then sets the length and deletes the defaults again) cost
more than the rest of idemkey's work on it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Final

from werkzeug.datastructures import Headers
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response as WerkzeugResponse

from ..http import parse_content_length

if TYPE_CHECKING:
    from flask import Flask
    from flask import Response as FlaskResponse

    from ..http import Response

__all__ = ["as_sent", "body_of", "render_view", "respond"]

_NAME: Final = itemgetter(0)
_VALUE: Final = itemgetter(1)
_NEWLINE: Final = re.compile(r"[\r\n]")  # werkzeug's test of a header value, in one search
_SET_DATA: Final = WerkzeugResponse.set_data
_new_headers = Headers.__new__


def render_view(app: Flask, view: Callable[..., Any], args: Any, kwargs: Any) -> FlaskResponse:
    """The view's answer as ``make_response`` builds it; ``abort(402)`` is an answer too."""
    try:
        return app.make_response(view(*args, **kwargs))
    except HTTPException as exc:  # render it as Flask would
        rendered = app.handle_user_exception(exc)
        if isinstance(rendered, HTTPException):  # no error handler: werkzeug's own page
            rendered = rendered.get_response()
        return app.make_response(rendered)


def body_of(response: FlaskResponse) -> bytes | None:
    """The whole body, as ``get_data()`` joins it; None for a streamed response.

    A list of bytes (what ``make_response`` and ``set_data`` leave) is joined here: werkzeug's
    ``is_streamed`` and ``get_data`` would take six Python calls to do the same. A
    direct-passthrough body (``send_file``: the server's ``wsgi.file_wrapper``) is streamed
    whatever it is: werkzeug refuses to read it, and waitress's file wrapper has a length,
    which ``is_streamed`` takes for a sequence.
    """
    data = response.response
    if type(data) is list:
        try:
            return b"".join(data)
        except TypeError:  # str chunks: werkzeug encodes them
            pass
    if response.direct_passthrough or response.is_streamed:
        return None
    return response.get_data()


def as_sent(response: FlaskResponse, body: bytes, headers: list[tuple[str, str]]) -> bytes | None:
    """The body a server sends of a response held whole, and its headers as werkzeug sends
    them (``headers`` is completed in place): no byte past the first Content-Length declared;
    without one, the Content-Length that ``get_wsgi_headers`` adds as the response goes out
    (a list body), so the replay is sized as the first answer was, not chunked. None for a
    body short of the length it declares (not a 204 or 304, whose length is not their body's):
    the server stops mid-body, so it is stored without its body, as an answer cut after its
    head.

    The WSGI, ASGI and Django adapters store the same cut; a replay of the whole body would
    send bytes the first answer never did.
    """
    for name, value in headers:
        if name.lower() == "content-length":
            declared = parse_content_length(value)
            if declared is None:
                return body
            if len(body) < declared and response.status_code not in (204, 304):
                return None
            return body[:declared]
    status = response.status_code
    if response.automatically_set_content_length and not (
        status in (204, 304) or 100 <= status < 200
    ):
        headers.append(("Content-Length", str(len(body))))
    return body


def respond(app: Flask, answer: Response) -> FlaskResponse:
    """One of idemkey's answers as ``app.response_class``, with exactly its headers.

    The same response as ``response_class(answer.body, status, answer.headers)`` with the
    default ``Content-Type`` and a ``Content-Length`` the answer has not got deleted again
    (as this function did until it was made cheaper); a header value with a line break
    raises werkzeug's ``ValueError`` as that did.
    """
    headers = list(answer.headers)
    if _NEWLINE.search("".join(map(_VALUE, headers))) is not None:
        raise ValueError("Header values must not contain newline characters.")
    names = list(map(str.lower, map(_NAME, headers)))  # in C calls only, no frame
    body = answer.body
    response_class = app.response_class
    stores_as_werkzeug = response_class.set_data is _SET_DATA
    lengths = names.count("content-length")
    if stores_as_werkzeug and lengths == 1 and response_class.automatically_set_content_length:
        # What set_data does to a single Content-Length: this body's length, under werkzeug's
        # spelling of the name, where the header stood.
        headers[names.index("content-length")] = ("Content-Length", str(len(body)))
    # The checked list as werkzeug's own Headers (what Headers(headers) would hold, without
    # two Python calls per header); the constructor keeps a Headers object as it is.
    checked = _new_headers(Headers)
    checked._list = headers
    # "201 Charged OK", the phrase as first sent, given to the constructor: setting it after
    # would parse the status twice.
    status = f"{answer.status} {answer.reason}" if answer.reason else answer.status
    if stores_as_werkzeug:  # set_data(body), without its calls: the length is set above
        response = response_class(None, status, checked)
        response.response = [body]
        if lengths > 1 and response.automatically_set_content_length:
            response.headers["Content-Length"] = str(len(body))  # one left, as set_data does
    else:  # the class stores a body its own way: let it
        response = response_class(body, status, checked)
        if not lengths:
            del response.headers["Content-Length"]
    if not lengths:  # no length the first answer did not have
        response.automatically_set_content_length = False
    if "content-type" not in names:
        del response.headers["Content-Type"]  # exactly the stored headers: no default added
    return response
