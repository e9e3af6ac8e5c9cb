"""The Flask extension's responses: a view's answer as Flask builds it, and idemkey's own
answers (a problem, a replay) as Flask responses carrying exactly the stored headers.

Kept apart from ``flask.py``, whose ``_guard`` only takes a request through the exchange.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from flask import current_app
from werkzeug.exceptions import HTTPException

if TYPE_CHECKING:
    from flask import Response as FlaskResponse
    from flask.typing import ResponseReturnValue

    from ..http import Response

__all__ = ["render_view", "respond"]

_NAME = itemgetter(0)


def render_view(view: Callable[..., Any], args: Any, kwargs: Any) -> FlaskResponse:
    """The view's answer as ``make_response`` builds it; ``abort(402)`` is an answer too."""
    try:
        return current_app.make_response(view(*args, **kwargs))
    except HTTPException as exc:  # render it as Flask would
        rendered = current_app.handle_user_exception(exc)
        if isinstance(rendered, HTTPException):  # no error handler: werkzeug's own page
            rendered = rendered.get_response()
        return current_app.make_response(rendered)


def respond(answer: Response) -> ResponseReturnValue:
    headers = answer.headers
    # "201 Charged OK", the phrase as first sent, given to the constructor: setting it after
    # would parse the status twice.
    status = f"{answer.status} {answer.reason}" if answer.reason else answer.status
    response = current_app.response_class(answer.body, status, headers)
    # The names, lower-cased, in C calls only (a set comprehension is a Python frame).
    names = set(map(str.lower, map(_NAME, headers)))
    if "content-type" not in names:
        del response.headers["Content-Type"]  # exactly the stored headers: no default added
    if "content-length" not in names:  # nor a length the first answer did not have
        del response.headers["Content-Length"]
        response.automatically_set_content_length = False
    return response
