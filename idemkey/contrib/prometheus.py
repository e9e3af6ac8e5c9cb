"""Prometheus metrics from idemkey events (``pip install 'idemkey-redis[prometheus]'``)::

    from prometheus_client import REGISTRY
    from idemkey.contrib.prometheus import prometheus_hook

    policy = Policy(on_event=prometheus_hook())          # once per process and registry

Metrics (``namespace`` defaults to ``idemkey``):

* ``idemkey_events_total{kind, method, route}`` — a counter per event kind (claimed, replayed,
  in_flight, mismatch, completed, released, takeover, lease_lost, record_lost, store_error,
  unprotected, too_large, expired; the heartbeat's record_lost has empty method and route).
  ``route`` is the route template (``/charges/<id>``), never the concrete path,
  so its cardinality is the number of guarded routes; a middleware guarding by method only
  (no ``routes=``) labels every request ``<unknown>`` (``idemkey.routes.ROUTE_UNKNOWN``);
  guard() records have method ``GUARD``.
* ``idemkey_redis_seconds{kind}`` — a histogram of the Redis time an event reports
  (``Event.redis_seconds``: the claim behind claimed/replayed/in_flight/mismatch/takeover, the
  complete or release behind completed/released).

Raw keys and scopes never become labels: they are client input, unbounded and possibly secret.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..events import Event

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["DEFAULT_BUCKETS", "prometheus_hook"]

#: Redis round trips are sub-millisecond on a LAN: the default prometheus buckets start at 5 ms.
DEFAULT_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip


def prometheus_hook(
    registry: CollectorRegistry | None = None,
    *,
    namespace: str = "idemkey",
    buckets: Sequence[float] = DEFAULT_BUCKETS,
) -> Callable[[Event], None]:
    """An ``on_event`` hook that counts events and times Redis calls.

    Registers its metrics in ``registry`` (default: prometheus_client's global ``REGISTRY``),
    so call it once per registry: a second call raises prometheus_client's "Duplicated
    timeseries" ``ValueError``. Needs ``prometheus-client`` (the ``prometheus`` extra).
    """
    try:
        from prometheus_client import REGISTRY, Counter, Histogram
    except ImportError as exc:
        raise ImportError(
            "prometheus_hook needs prometheus-client: pip install 'idemkey-redis[prometheus]'"
        ) from exc

    target: Any = registry if registry is not None else REGISTRY
    events = Counter(
        "events",
        "idemkey events by kind (claimed, replayed, in_flight, mismatch, completed, ...)",
        ["kind", "method", "route"],
        namespace=namespace,
        registry=target,
    )
    redis_time = Histogram(
        "redis_seconds",
        "Time spent in the Redis call behind an idemkey event",
        ["kind"],
        namespace=namespace,
        registry=target,
        buckets=tuple(buckets),
    )

    def on_event(event: Event) -> None:
        events.labels(event.kind, event.method, event.route).inc()
        if event.redis_seconds is not None:
            redis_time.labels(event.kind).observe(event.redis_seconds)

    return on_event
