"""The options of :class:`~idemkey.contrib.celery.IdempotentTask`, checked when Celery builds
a task: a wrong one is a :class:`~idemkey.ConfigurationError` naming it and the task, not a
failed run."""

from __future__ import annotations

import inspect
import os
import threading
from typing import Any, Final

from celery import Task  # type: ignore[import-untyped]

from .._options import seconds
from ..adapters._checks import checked_guard_policy, described
from ..errors import ConfigurationError
from ..guard import StepRetry
from ..guard._failures import FailureRules, rules_for
from ..store import RedisStore

__all__ = ["checked_options", "resolved_store", "step_retry"]

_RESOLVING: Final = threading.Lock()


def checked_options(cls: type[Any]) -> FailureRules | None:
    """Refuse a bad option the class sets when Celery builds it (``@app.task(...)``: when the
    worker starts, or at the first use of a lazy task), not at every run; each error names
    the option and the task. The ``rules_for`` of its ``idempotency_cache_exceptions``."""
    own = cls.__dict__

    def label(option: str) -> str:
        return f"{option}= (task {own.get('name', cls.__name__)!r})"

    def refuse(option: str, message: str) -> ConfigurationError:
        return ConfigurationError(f"{label(option)}: {message}")

    store = own.get("idempotency_store")
    if store is not None and not isinstance(store, RedisStore):
        # A factory is a callable that is no client (a client has execute_command).
        if not callable(store) or hasattr(store, "execute_command"):
            got = described(store, RedisStore)
            raise refuse(
                "idempotency_store", f"expected a RedisStore or a function returning one, got {got}"
            )
        try:
            inspect.signature(store).bind()
        except TypeError:
            raise refuse(
                "idempotency_store", "a store factory is called with no arguments"
            ) from None
        except ValueError:
            pass  # no signature to read (a builtin): called as it is
    key = own.get("idempotency_key")
    if key is not None and not callable(key):
        raise refuse(
            "idempotency_key",
            "expected a function of the task's arguments returning the key, got "
            + (f"the string {key!r}" if isinstance(key, str) else type(key).__name__),
        )
    if "idempotency_policy" in own:
        given = cls.idempotency_store  # a factory's store: its policy is checked at the run
        known = given.policy if isinstance(given, RedisStore) else None
        checked_guard_policy(own["idempotency_policy"], known, label("idempotency_policy"))
    if own.get("idempotency_deadline") is not None:
        seconds(own["idempotency_deadline"], label("idempotency_deadline"))
    for option in (
        "idempotency_retry_max",
        "idempotency_store_retry_delay",
        "idempotency_store_retry_max",
    ):
        if option in own:
            seconds(own[option], label(option), positive=False)
    count = own.get("idempotency_store_retries", 0)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise refuse("idempotency_store_retries", f"expected a count (an int >= 0), got {count!r}")
    if not isinstance(own.get("idempotency_outcome", False), bool):
        raise refuse(
            "idempotency_outcome", f"expected True or False, got {own['idempotency_outcome']!r}"
        )
    try:
        return rules_for(own.get("idempotency_cache_exceptions", ()))
    except ConfigurationError as exc:
        raise refuse("idempotency_cache_exceptions", str(exc)) from None


def step_retry(task: Task, **changes: Any) -> StepRetry:
    """A :class:`~idemkey.StepRetry` with ``task``'s Celery retry settings, for a step that
    retries in place as the task would retry as a whole: ``max_retries`` + 1 attempts,
    ``autoretry_for`` retried (every ``Exception`` when it is empty), ``dont_autoretry_for``
    never, a wait of ``retry_backoff`` seconds (``True``: 1; ``False``: ``default_retry_delay``,
    not growing) doubling up to ``retry_backoff_max``, spread at random when ``retry_jitter``
    (StepRetry spreads a wait by up to its length either way, where Celery draws between 0 and
    it). ``changes`` override any field (``timeout=``, ``attempts=``).
    """
    max_retries = getattr(task, "max_retries", 3)
    if max_retries is None:
        raise ConfigurationError("max_retries=None (retry forever) has no StepRetry equivalent")
    backoff = getattr(task, "retry_backoff", False)
    if backoff:
        first, multiplier = float(max(1, int(backoff))), 2.0
    else:
        first, multiplier = float(getattr(task, "default_retry_delay", 180) or 0), 1.0
    fields: dict[str, Any] = {
        "attempts": int(max_retries) + 1,
        "backoff": first,
        "multiplier": multiplier,
        "max_backoff": max(first, float(getattr(task, "retry_backoff_max", 600))),
        "jitter": 1.0 if getattr(task, "retry_jitter", True) and backoff else 0.0,
        "retry_on": tuple(getattr(task, "autoretry_for", ())) or (Exception,),
        "never": tuple(getattr(task, "dont_autoretry_for", ())),
    }
    fields.update(changes)
    return StepRetry(**fields)


def resolved_store(task: Any) -> RedisStore:
    """The store of ``task``: its ``idempotency_store``, or what that factory returns, called
    once per worker process (under a lock: a threads pool's first tasks start together, and
    each called it, a store and a connection pool per thread)."""
    with _RESOLVING:
        cached = task._idemkey_store
        if cached is not None and cached[0] == os.getpid():
            return cached[1]  # type: ignore[no-any-return]
        source = type(task).idempotency_store
        if source is None:
            raise ConfigurationError(
                f"task {task.name} has no idempotency_store: pass one to @app.task(...)"
            )
        store = source if isinstance(source, RedisStore) else source()
        if not isinstance(store, RedisStore):
            raise ConfigurationError("idempotency_store must be a RedisStore or return one")
        task._idemkey_store = (os.getpid(), store)
        return store
