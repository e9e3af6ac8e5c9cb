"""Celery tasks that run once per idempotency key: ``@app.task(base=IdempotentTask, ...)``.

::

    store = RedisStore(redis.Redis.from_url(REDIS_URL))

    @app.task(base=IdempotentTask, bind=True, acks_late=True, idempotency_store=store)
    def place_order(self, order_id, amount):
        call = self.idempotent_call
        call.step("reserve", reserve_stock, order_id)
        receipt = call.step("charge", psp.charge, amount, key=call.step_key("charge"))
        call.step("ship", queue_shipping, order_id)
        return receipt

What the base class does around the task body (a ``guard`` on the key):

* The key is derived from the task's name and its arguments, bound to the signature (so
  ``f(1, amount=5)`` and ``f(1, 5)`` are one call): a message re-published by the producer
  (a new delivery id) is still the same call. ``idempotency_key=lambda order_id, **_: ...``
  names the key instead; the arguments are then the payload, and the same key with other
  arguments raises :class:`~idemkey.KeyReuseError`.
* The task's return value is stored (it must be msgspec-encodable, as Celery's JSON needs
  anyway). A duplicate (redelivered, re-sent) returns the stored value without running.
* A duplicate that arrives while the first still runs becomes a Celery retry with a
  countdown (state RETRY, then the stored result): never a failure, never a second run. It
  does not count against the task's ``max_retries``. So does a run whose lease was lost to
  a takeover: the taker's result is the one stored, and the retry returns it.
* With ``acks_late=True``, a worker killed mid-task has its message redelivered; the new run
  takes the record over once the dead worker's lease lapses and resumes after the last
  finished ``call.step``.

``idempotency_store`` is a :class:`~idemkey.RedisStore`, or a function returning one (called
once per worker process, after the fork).
"""

from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Callable
from typing import Any

from celery import Task  # type: ignore[import-untyped]
from celery.exceptions import Retry  # type: ignore[import-untyped]

from .._codec import encode_payload
from ..errors import ConfigurationError, LeaseLostError, RequestInFlightError, UsageError
from ..guard import Call, guard
from ..policy import Policy
from ..store import RedisStore

__all__ = ["IdempotentTask", "celery_key"]

_REQUEST_ATTRIBUTE = "idemkey_call"


def celery_key(payload: bytes) -> str:
    """The default key of a task call: a digest of its encoded, signature-bound arguments."""
    return "args:" + hashlib.sha256(payload).hexdigest()


class IdempotentTask(Task):  # type: ignore[misc]
    """A Celery task base class that runs the task once per key; see the module docstring."""

    #: A RedisStore, or a function returning one (called once per worker process).
    idempotency_store: RedisStore | Callable[[], RedisStore] | None = None
    #: ``key(*args, **kwargs) -> str``; default: a digest of the task's bound arguments.
    idempotency_key: Callable[..., str] | None = None
    #: A Policy for this task (lease, retention, wait); default: the store's.
    idempotency_policy: Policy | None = None
    #: Longest countdown, in seconds, of the retry of a duplicate that found the call in
    #: flight (shorter when the running call's lease lapses sooner).
    idempotency_retry_max: float = 2.0

    _idemkey_store: tuple[int, RedisStore] | None = None

    @property
    def idempotent_call(self) -> Call[Any]:
        """The claimed call of the running task: ``call.step``, ``call.step_key``,
        ``call.fence``. Only inside the task body."""
        call = getattr(self.request, _REQUEST_ATTRIBUTE, None)
        if call is None:
            raise UsageError("idempotent_call is only available inside the running task")
        return call  # type: ignore[no-any-return]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        store = self._resolve_store()
        key, payload = self._identify(args, kwargs)
        scope, policy = f"celery:{self.name}", self.idempotency_policy
        try:
            with guard(store, key, payload=payload, scope=scope, policy=policy) as call:
                if call.replayed:
                    return call.result
                setattr(self.request, _REQUEST_ATTRIBUTE, call)
                try:
                    result = self.run(*args, **kwargs)
                finally:
                    setattr(self.request, _REQUEST_ATTRIBUTE, None)
                call.save(result)
                return result
        except RequestInFlightError as exc:
            raise self._retry_later(exc.retry_after, exc) from exc
        except LeaseLostError as exc:
            # Another run took the record over (ours outlived its lease): its result is the
            # one stored; a retry returns it.
            raise self._retry_later(0.1, exc) from exc

    def _identify(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, bytes]:
        try:
            bound = inspect.signature(self.run).bind(*args, **kwargs)
        except TypeError:
            arguments: object = {"args": list(args), "kwargs": kwargs}
        else:
            bound.apply_defaults()
            arguments = dict(bound.arguments)
        payload = encode_payload(arguments)
        # Read from the class: a function stored as a class attribute would bind as a method.
        make_key = type(self).idempotency_key
        key = make_key(*args, **kwargs) if make_key is not None else celery_key(payload)
        return key, payload

    def _resolve_store(self) -> RedisStore:
        cached = self._idemkey_store
        if cached is not None and cached[0] == os.getpid():
            return cached[1]
        source = type(self).idempotency_store
        if source is None:
            raise ConfigurationError(
                f"task {self.name} has no idempotency_store: pass one to @app.task(...)"
            )
        store = source if isinstance(source, RedisStore) else source()
        if not isinstance(store, RedisStore):
            raise ConfigurationError("idempotency_store must be a RedisStore or return one")
        self._idemkey_store = (os.getpid(), store)
        return store

    def _retry_later(self, after: float, exc: BaseException) -> BaseException:
        """Send this same call again in ``after`` seconds (at most idempotency_retry_max),
        with its retry count unchanged, and return Celery's Retry to raise."""
        request = self.request
        if request.called_directly or request.is_eager:
            return exc  # no worker to send it to: the caller sees the error itself
        countdown = max(0.05, min(after, self.idempotency_retry_max))
        signature = self.signature_from_request(request, countdown=countdown)
        signature.apply_async()
        return Retry(exc=exc, when=countdown, sig=signature)  # type: ignore[no-any-return]
