"""The sans-IO HTTP exchange that every HTTP adapter shares: one object per request.

Every HTTP decision of docs/design.md#http-decisions is made here, without I/O, and in one
order: :func:`begin` looks at the :class:`Request` and gives an :class:`Exchange` (or a
Response to send, or None to pass through); the exchange is then asked one transition at a
time, as an h11 connection is, and one asked out of order raises ProtocolError (the table is
in ``_transitions``). The drivers (``adapters/_async_driver``, ``_sync_driver``) do the store
I/O around it and adapters only move bytes::

    exchange = begin(policy, request)             # None: pass through; Response: answer it
    exchange.announced(), exchange.received(body) # a Response: send it, stop
    fingerprint = exchange.claiming()             # then store.claim(exchange.record, ...)
    answer = exchange.decide(decision)            # a Response (replay, 409, 422): send it
    (on StoreError: exchange.store_failed(exc) gives a 503, or None to run unprotected,
     then exchange.unprotected_ended() once the app returned or raised: in a finally)
    run the app; exchange.started(status, headers) once its head went out
    plan = exchange.finish(body)                  # Complete(bytes) or Release; or fail(reason)
    exchange.settled(ok) once the store answered  # or settle_failed(exc)

The request's entry (``_begin``, with its fingerprint in ``_fingerprint``), the exchange's
decisions (``_exchange``), the answers it renders (``_answers``), the request view and the
messages (``_messages``), the problem documents (``_problems``) and the response body copy
(``_body_copy``) have modules of their own; this one re-exports the names users import from it.
"""

from ._answers import BODY_NOT_KEPT_HEADER as BODY_NOT_KEPT_HEADER
from ._answers import EXPOSE_HEADER as EXPOSE_HEADER
from ._answers import REPLAYED_HEADER as REPLAYED_HEADER
from ._answers import RESPONSE_LOST as RESPONSE_LOST
from ._answers import exposed_headers as exposed_headers
from ._begin import begin as begin
from ._body_copy import BodyCopy as BodyCopy
from ._exchange import Exchange as Exchange
from ._messages import Complete as Complete
from ._messages import Headers as Headers
from ._messages import Release as Release
from ._messages import Request as Request
from ._messages import Response as Response
from ._messages import content_length as content_length
from ._messages import parse_content_length as parse_content_length
from ._problems import PROBLEM_TYPE as PROBLEM_TYPE
from ._problems import RETRY as RETRY
from ._problems import Problem as Problem
from ._problems import RetryAdvice as RetryAdvice
from ._problems import problem as problem
from ._problems import render as render

__all__ = [
    "BODY_NOT_KEPT_HEADER",
    "BodyCopy",
    "REPLAYED_HEADER",
    "RETRY",
    "Complete",
    "Exchange",
    "Headers",
    "Problem",
    "Release",
    "Request",
    "Response",
    "RetryAdvice",
    "begin",
    "exposed_headers",
    "problem",
    "render",
]
