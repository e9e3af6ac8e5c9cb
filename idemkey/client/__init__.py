"""The client half: call an idempotent HTTP API with one key per operation, retried safely.

``pip install 'idemkey-redis[client]'`` (httpx). ::

    from idemkey.client import Client, RefusedError, RetryPolicy

    with Client(base_url="https://payments.internal", timeout=2.0) as client:
        operation = client.prepare("POST", "/charges", json={"amount": 1000})
        save(operation.key)                  # optional: resume after a restart with this key
        reply = client.send(operation)       # same key, same bytes on every attempt
        reply.replayed                       # True if the server answered from its store

``Client(on_replay="refuse")`` raises :class:`UnexpectedReplayError` when a call is answered
with a replay and no earlier attempt of it may have reached the handler: the operation ran
before, for another call, so nothing it hands out is new (CVE-2026-34210: a server that
ignored Stripe's ``Idempotent-Replayed`` handed out resources for one payment again and
again). A function as ``on_replay`` sees every replay.

A logical call keeps one key (a random UUID unless ``idempotency_key=`` is given) and one
serialisation of its body across attempts. It retries connection errors, timeouts, a dropped
response, ``409 in_flight``, 429 and 502-504 with capped exponential backoff and jitter,
honouring ``Retry-After``, within an overall deadline (:class:`RetryPolicy`); it never retries
a refusal such as ``422 key_reused``, which raises :class:`RefusedError` with the problem's
``code``. :class:`AsyncClient` is the asyncio twin; :class:`IdempotentTransport` and
:class:`AsyncIdempotentTransport` give the same retries to an ``httpx`` client you already have.

Errors::

    IdemkeyError
    └── ClientError
        ├── RefusedError            code, problem, status, response, attempts
        ├── RetriesExhaustedError   reason ("deadline"/"attempts"), last, attempts, response
        ├── UnexpectedReplayError   reply, key, attempts (Client(on_replay="refuse"))
        ├── UnusableAnswerError     key, attempts (httpx raised on the server's answer)
        └── ClientStateError
"""

from __future__ import annotations

try:
    import httpx  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("idemkey.client needs httpx: pip install 'idemkey-redis[client]'") from exc

from ._async import AsyncClient, AsyncIdempotentTransport
from ._errors import (
    ClientError,
    ClientStateError,
    RefusedError,
    RetriesExhaustedError,
    UnexpectedReplayError,
    UnusableAnswerError,
)
from ._operation import IdempotentResponse, Operation, RetryEvent, RetryHook
from ._retry import (
    Done,
    GiveUp,
    Refused,
    Retry,
    RetryPolicy,
    Schedule,
    Step,
    parse_retry_after,
)
from ._shell import ReplayCheck
from ._sync import Client, IdempotentTransport

# A traceback names the public path (idemkey.client.UnexpectedReplayError), the one to import
# and catch, not the private module that defines it.
for _error in (
    ClientError,
    ClientStateError,
    RefusedError,
    RetriesExhaustedError,
    UnexpectedReplayError,
    UnusableAnswerError,
):
    _error.__module__ = __name__
del _error

__all__ = [
    "AsyncClient",
    "AsyncIdempotentTransport",
    "Client",
    "ClientError",
    "ClientStateError",
    "Done",
    "GiveUp",
    "IdempotentResponse",
    "IdempotentTransport",
    "Operation",
    "Refused",
    "RefusedError",
    "ReplayCheck",
    "Retry",
    "RetriesExhaustedError",
    "RetryEvent",
    "RetryHook",
    "RetryPolicy",
    "Schedule",
    "Step",
    "UnexpectedReplayError",
    "UnusableAnswerError",
    "parse_retry_after",
]
