"""Optional integrations: ``on_event`` hooks for metrics and tracing libraries.

Each module imports its library only when its factory is called, so ``import idemkey`` never
needs them:

* :func:`idemkey.contrib.prometheus.prometheus_hook` (``prometheus-client``: the ``prometheus``
  extra, ``pip install 'idemkey-redis[prometheus]'``)
* :func:`idemkey.contrib.otel.otel_hook` (``opentelemetry-api``: the ``otel`` extra,
  ``pip install 'idemkey-redis[otel]'``)

Several hooks combine with :func:`chain`.
"""

from __future__ import annotations

from collections.abc import Callable

from .._options import _function as plain_function
from ..events import Event, call_hook

__all__ = ["chain"]


def chain(*hooks: Callable[[Event], None] | None) -> Callable[[Event], None]:
    """One ``on_event`` hook that calls each of ``hooks`` in order (``None`` entries skipped).

    A hook that raises does not stop the others; the error is logged by idemkey like any
    failing hook. An async hook is refused, as ``Policy(on_event=...)`` refuses one: called
    synchronously, its coroutine would never be awaited.
    """
    for position, hook in enumerate(hooks, 1):
        if hook is not None:
            plain_function(hook, f"idemkey.contrib.chain() argument {position}")
    live: tuple[Callable[[Event], object], ...] = tuple(hook for hook in hooks if hook is not None)

    def on_event(event: Event) -> None:
        failure: Exception | None = None
        for hook in live:
            try:
                call_hook(hook, event)
            except Exception as exc:  # the others still run; emit() logs the first failure
                failure = failure or exc
        if failure is not None:
            raise failure

    return on_event
