"""Celery tasks that run once per idempotency key: ``@app.task(base=IdempotentTask, ...)``.

::

    store = RedisStore(redis.Redis.from_url(REDIS_URL))

    @app.task(base=IdempotentTask, bind=True, idempotency_store=store)
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
* The task's return value is stored as Celery's JSON (kombu's) writes it, and a duplicate
  (redelivered, re-sent) returns it without running: the same value, of the same types
  (``datetime``, ``Decimal``, ``UUID``, ``bytes``, ...), the first caller got. A value that JSON
  cannot carry (or, under another ``result_serializer``, would not give back equal) raises
  :class:`~idemkey.ResultNotStorableError`, and the call is recorded as done, its result not
  kept (contrib/_celery_results.py).
* A duplicate that arrives while the first still runs becomes a Celery retry with a
  countdown of the error's ``retry_after`` (at most 1 s, and at most
  ``idempotency_retry_max``; the logged ``RequestInFlightError`` names that same countdown):
  state RETRY, then the stored result; never a failure, never a second run. It does not count
  against the task's ``max_retries``, and carries no ``expires`` (the duplicate came in
  time).
* A run that lost its record (:class:`~idemkey.LeaseLostError`) never claims it again. Lost
  to a takeover (the record in flight under another owner, or completed), it becomes a retry
  that only replays: it waits while the taker runs and returns the taker's stored result.
  Cancelled by an operator (``idemkey cancel``: the record released, no owner) or removed,
  the task fails with :class:`RunCancelledError` and is not sent again; a later send of the
  call resumes after the finished steps (or, after ``--abandon``, starts afresh).
* A claim that could not reach Redis (:class:`~idemkey.StoreError`; nothing ran) becomes a
  Celery retry too, counted in ``request.retries``, with a countdown of
  ``idempotency_store_retry_delay`` doubling per retry up to ``idempotency_store_retry_max``
  (1, 2, 4, ... 30 s by default), at most ``idempotency_store_retries`` times (10, about
  3 minutes in all); then the task fails with the ``StoreError``. A ``StoreError`` after
  the body began is not retried.
* A worker killed mid-task has its message delivered again. The base class sets
  ``acks_late = True`` (acknowledge after the task ran, not before) and
  ``reject_on_worker_lost = True``: without it Celery's default prefork pool acknowledges
  the message of a pool child that died (SIGKILL, the OOM killer) and records
  ``WorkerLostError``, so the task would never run again. With it the message is requeued;
  on the solo, threads and gevent pools the whole worker dies, and the broker redelivers the
  unacknowledged message (with Redis, after ``visibility_timeout``). The new run finds the
  dead run's record in flight (a retry, as above), takes it over once its lease lapses, and
  resumes after the last finished ``call.step``. ``acks_late=False`` or
  ``reject_on_worker_lost=False`` on a task turns either off. A task that kills its process
  on every run is redelivered every time (Celery's "message loop"); each takeover raises
  ``call.fence``, which such a task can check.

``idempotency_store`` is a :class:`~idemkey.RedisStore`, or a function returning one (called
once per worker process, after the fork, with no arguments). Every ``idempotency_*`` option is
checked when Celery builds the task (as the worker starts, or at a lazy task's first use): a
wrong one is a :class:`~idemkey.ConfigurationError` naming it and the task, not a failed run.

Which layer retries what (docs/queues.md): ``call.step(..., retry=StepRetry(...))`` retries one
step in place, within the delivery, its attempts counted in the record (a redelivery after a
SIGKILL continues the count); Celery (``autoretry_for``, ``self.retry()``) sends the whole task
again, and the new delivery resumes after the finished steps. Where the settings overlap they
map onto Celery's own:

* ``idempotency_cache_exceptions`` are added to the task's ``dont_autoretry_for``: a
  remembered failure is final, so Celery does not send it again (unless the task passes its
  own ``dont_autoretry_for=`` to the decorator, which then wins, as in Celery). A remembered
  class broader than one in ``autoretry_for`` is left out (``Exception`` remembered,
  ``ConnectionError`` autoretried): the narrower declaration wins. Celery's own control flow
  (``Retry``, from ``self.retry()`` or autoretry, ``Ignore``, ``Reject``) is never
  remembered, whatever the classes cover: it releases the key, as any unremembered
  exception does, and the retry's delivery resumes after the finished steps;
* the task's soft time limit (``soft_time_limit``, or the one the message carries) is the
  guard's ``deadline=`` unless ``idempotency_deadline`` names another: no step starts past it,
  on every pool (Celery enforces time limits on prefork only);
* :func:`step_retry` builds a ``StepRetry`` from the task's Celery retry settings, for a step
  that should retry in place the way the task would retry as a whole.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Callable
from typing import Any

try:
    from celery import Task  # type: ignore[import-untyped]
    from celery.exceptions import Retry, TaskPredicate  # type: ignore[import-untyped]
except ImportError as exc:
    raise ImportError(
        "idemkey.contrib.celery needs Celery: pip install 'idemkey-redis[celery]'"
    ) from exc

from .._codec import encode_payload
from ..errors import (
    ConfigurationError,
    IdemkeyError,
    LeaseLostError,
    RecordFormatError,
    RequestInFlightError,
    ResultNotStorableError,
    StoreError,
    UsageError,
)
from ..guard import Call, guard
from ..policy import Policy
from ..store import RedisStore
from ._celery_options import checked_options, resolved_store, step_retry
from ._celery_results import Unkept, as_stored, from_stored

__all__ = ["IdempotentTask", "RunCancelledError", "celery_key", "step_retry"]

_REQUEST_ATTRIBUTE = "idemkey_call"
#: The message header of a retry sent after a lost lease: that run replays, never claims.
_REPLAY_ONLY = "idemkey_replay_only"


class RunCancelledError(LeaseLostError):
    """The task's record was cancelled (``idemkey cancel``) or removed while it ran: the task
    fails with this and is not sent again, as a retry would claim the record the operator gave
    up. A later send resumes after the finished steps (from the start after ``--abandon``)."""

    def __init__(self, key: str, detail: str = "") -> None:
        IdemkeyError.__init__(
            self,
            f"the idempotency record of key {key!r} was cancelled (idemkey cancel) or removed "
            "while this task ran: the run stopped and is not sent again; send the task again "
            "to resume after its finished steps (after --abandon, to start afresh)"
            + (f" ({detail})" if detail else ""),
        )
        self._keep_args(key, detail)
        self.key, self.detail, self.fence = key, detail, None
        self.committed = self.recorded = False


def _marked(request: Any) -> dict[str, Any]:
    return {"headers": {**(request.headers or {}), _REPLAY_ONLY: True}}


def celery_key(payload: bytes) -> str:
    """The default key of a task call: a digest of its encoded, signature-bound arguments."""
    return "args:" + hashlib.sha256(payload).hexdigest()


class IdempotentTask(Task):  # type: ignore[misc]
    """A Celery task base class that runs the task once per key; see the module docstring."""

    #: Acknowledge a message once the task ran, not before: a worker that dies mid-task
    #: leaves it to be delivered again (the record makes the second delivery safe).
    acks_late = True
    #: Requeue, not acknowledge, the message of a prefork pool child that died (SIGKILL, the
    #: OOM killer); Celery's default marks it failed with WorkerLostError and drops it.
    reject_on_worker_lost = True

    #: A RedisStore, or a function returning one (called once per worker process).
    idempotency_store: RedisStore | Callable[[], RedisStore] | None = None
    #: ``key(*args, **kwargs) -> str``; default: a digest of the task's bound arguments.
    idempotency_key: Callable[..., str] | None = None
    #: A Policy for this task (lease, retention, wait); default: the store's.
    idempotency_policy: Policy | None = None
    #: Longest countdown, in seconds, of the retry of a duplicate that found the call in
    #: flight; the countdown is the error's ``retry_after`` (at most 1 s) when shorter.
    idempotency_retry_max: float = 2.0
    #: How many times a task whose claim could not reach Redis is sent again (counted in
    #: ``request.retries``) before it fails with the StoreError.
    idempotency_store_retries: int = 10
    #: Countdown, in seconds, of the first of those retries; it doubles with each one ...
    idempotency_store_retry_delay: float = 1.0
    #: ... up to this many seconds.
    idempotency_store_retry_max: float = 30.0
    #: Deterministic failures (exception classes, or a mapping of class to field names):
    #: the first one the task raises is stored as its outcome, and every redelivery or
    #: retry of the same call raises it again without running the body. Celery's control
    #: flow (``Retry``, ``Ignore``, ``Reject``) is never remembered, even under ``Exception``.
    idempotency_cache_exceptions: object = ()
    #: Seconds from the claim after which no step starts (the guard's ``deadline=``); None:
    #: the soft time limit of the message or the task, if any.
    idempotency_deadline: float | None = None

    #: Return ``{"result": <the task's result>, "replayed": <bool>}`` instead of the bare
    #: result, so the caller's ``AsyncResult.get()`` tells a replay (the stored result of an
    #: earlier run, the task body not run) from a run. Off by default: results stay as they
    #: were. Either way ``self.request.idempotent_replayed`` says it to the worker's own
    #: hooks (``after_return``, the ``task_success`` signal's ``sender.request``).
    idempotency_outcome: bool = False

    _idemkey_store: tuple[int, RedisStore] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Celery's autoretry reads dont_autoretry_for when it wraps the task, after the class
        # is made: a remembered failure is final, so it must never be sent again.
        # A remembered class broader than one autoretry_for names (Exception, with
        # ConnectionError retried) stays out: Celery would otherwise retry nothing at all, so
        # the narrower declaration wins, and the retry (Celery's Retry) is never remembered.
        super().__init_subclass__(**kwargs)
        remembered = checked_options(cls)
        if remembered is not None:
            own = tuple(getattr(cls, "dont_autoretry_for", ()))
            retried = tuple(getattr(cls, "autoretry_for", ()))
            cls.dont_autoretry_for = own + tuple(
                t
                for t in remembered.types
                if t not in own and not any(r is not t and issubclass(r, t) for r in retried)
            )

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
        began = False
        signal: TaskPredicate | None = None
        stopped: RunCancelledError | None = None
        ended: BaseException
        replay_only = bool(getattr(self.request, _REPLAY_ONLY, None))
        if replay_only:  # sent after a lost lease: only a completed record is entered
            verdict = self._after_lost_lease(store, key, scope, None)
            if verdict is not None:
                raise verdict
        try:
            remember = type(self).idempotency_cache_exceptions
            deadline = self._deadline()
            with guard(
                store,
                key,
                payload=payload,
                scope=scope,
                policy=policy,
                cache_exceptions=remember,
                deadline=deadline,
            ) as call:
                began = True
                self.request.idempotent_replayed = call.replayed
                if call.replayed:
                    return self._outcome(from_stored(call.result), True)
                if replay_only:
                    # The completed record went (forgotten, expired) since it was read: left
                    # without a result (never raising in here: that could be remembered),
                    # this claim is released, and nothing runs.
                    ended = stopped = RunCancelledError(key, "its completed record is gone")
                else:
                    setattr(self.request, _REQUEST_ATTRIBUTE, call)
                    try:
                        result = self.run(*args, **kwargs)
                    except TaskPredicate as raised:
                        # self.retry() (autoretry_for's too), Ignore, Reject: Celery's control
                        # flow, never the call's outcome, whatever cache_exceptions covers
                        # (Exception covers them all). The block is left without a result,
                        # which releases the key (finished steps kept): the retry's delivery
                        # resumes after them.
                        ended = signal = raised
                    finally:
                        setattr(self.request, _REQUEST_ATTRIBUTE, None)
                    if signal is None:
                        self._save(call, key, result)
                        return self._outcome(result, False)
            raise ended  # outside any except clause: its own context is kept
        except RunCancelledError:
            raise
        except RequestInFlightError as exc:
            countdown = min(exc.retry_after, self.idempotency_retry_max)
            # The error Celery logs and stores with the retry names the countdown it has.
            shown = RequestInFlightError(countdown, exc.lease_remaining)
            raise self._retry_later(countdown, shown) from exc
        except LeaseLostError as exc:
            raise self._after_lost_lease(store, key, scope, exc) or exc from exc
        except StoreError as exc:
            if stopped is not None:
                raise stopped from exc
            if signal is not None:
                # The release failed: the key stays claimed until its lease lapses, and the
                # retry Celery already sent waits for that (in flight), then takes it over.
                raise signal from exc
            if began or isinstance(exc, RecordFormatError):
                raise  # the body ran (or a record this version cannot read): not ours to redo
            # The claim never reached Redis: nothing ran, so sending the task again is safe.
            raise self._retry_claim(exc) from exc

    def _after_lost_lease(
        self, store: RedisStore, key: str, scope: str, exc: LeaseLostError | None
    ) -> BaseException | None:
        """What a run that lost its record (``exc``; None: a replay-only retry, before it
        claims) does, by the record's state; None: enter the completed record (a replay).
        Never a claim, which would run the job an operator cancelled: another owner's record
        (a takeover), in flight or lapsed, is waited for by replay-only retries, a completed
        one replayed; a released or missing one (``idemkey cancel``, a forget) ends the task."""
        try:
            status = store.record(key, scope=scope)
        except StoreError:
            state = "unread"  # the retry reads it again
        else:
            state = "gone" if status is None else status.state
        if state == "complete" and exc is None:
            return None
        if state in ("released", "gone"):  # Celery logs the failure, naming the cancel
            detail = "" if exc is None or not exc.committed else str(exc)
            return RunCancelledError(key, detail)
        countdown = 0.1 if state == "complete" else min(1.0, self.idempotency_retry_max)
        return self._retry_later(countdown, exc or LeaseLostError(), replay_only=True)

    def _save(self, call: Call[Any], key: str, result: Any) -> None:
        """Store ``result`` as Celery's JSON carries it to the caller (``_celery_results``)."""
        serializer = getattr(self.backend, "serializer", None) or "json"
        try:
            stored = as_stored(result, serializer)
        except Unkept as exc:
            call.save_not_kept()
            raise ResultNotStorableError(key, str(exc)) from exc
        call.save(stored)

    def _outcome(self, result: Any, replayed: bool) -> Any:
        if type(self).idempotency_outcome:
            return {"result": result, "replayed": replayed}
        return result

    def _deadline(self) -> float | None:
        if self.idempotency_deadline is not None:
            return self.idempotency_deadline
        limits = getattr(self.request, "timelimit", None)  # (hard, soft) of the message
        soft = limits[1] if limits and len(limits) > 1 and limits[1] else self.soft_time_limit
        return float(soft) if soft else None

    def _identify(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, bytes]:
        try:
            bound = inspect.signature(self.run).bind(*args, **kwargs)
        except TypeError:
            arguments: object = {"args": list(args), "kwargs": kwargs}
        else:
            bound.apply_defaults()
            arguments = dict(bound.arguments)
        try:
            payload = encode_payload(arguments)
        except ConfigurationError as exc:  # its advice (payload=) is the guard's, not a task's
            raise ConfigurationError(
                f"task {self.name!r}: cannot fingerprint its arguments ({exc.__cause__ or exc}); "
                "IdempotentTask fingerprints them with msgspec (built-ins, dataclasses, ints "
                "within 64 bits), with idempotency_key= too (they are its payload): pass such a "
                "value as a str"
            ) from exc
        # Read from the class: a function stored as a class attribute would bind as a method.
        make_key = type(self).idempotency_key
        key = make_key(*args, **kwargs) if make_key is not None else celery_key(payload)
        return key, payload

    def _resolve_store(self) -> RedisStore:
        cached = self._idemkey_store
        if cached is not None and cached[0] == os.getpid():
            return cached[1]
        return resolved_store(self)

    def _retry_later(
        self, countdown: float, exc: BaseException, *, replay_only: bool = False
    ) -> BaseException:
        """Send this same call again in ``countdown`` seconds, with its retry count unchanged,
        and return Celery's Retry to raise; ``replay_only``: a retry that never claims."""
        request = self.request
        if request.called_directly or request.is_eager:
            return exc  # no worker to send it to: the caller sees the error itself
        # No expiry: the duplicate was delivered in time, and the retry only polls for the
        # result (the message's expires, copied, would have Celery discard it as REVOKED).
        mark = _marked(request) if replay_only or getattr(request, _REPLAY_ONLY, None) else {}
        signature = self.signature_from_request(request, countdown=countdown, expires=None, **mark)
        signature.apply_async()
        return Retry(exc=exc, when=countdown, sig=signature)  # type: ignore[no-any-return]

    def _retry_claim(self, exc: StoreError) -> BaseException:
        """A Celery retry of a task whose claim could not reach Redis, with a doubling
        countdown; past ``idempotency_store_retries`` (or outside a worker), the error."""
        request = self.request
        if request.called_directly or request.is_eager:
            return exc
        attempt = min(int(request.retries or 0), 32)
        countdown = min(
            self.idempotency_store_retry_delay * 2**attempt, self.idempotency_store_retry_max
        )
        mark = _marked(request) if getattr(request, _REPLAY_ONLY, None) else {}  # stays one
        # Task.retry raises the StoreError itself once the retries are spent.
        return self.retry(  # type: ignore[no-any-return]
            exc=exc, countdown=countdown, max_retries=self.idempotency_store_retries, throw=False,
            **mark,
        )  # fmt: skip
