"""OpenTelemetry from idemkey events (``pip install 'idemkey-redis[otel]'``)::

    from idemkey.contrib.otel import otel_hook

    policy = Policy(on_event=otel_hook())

Design: idemkey does not open spans of its own. Its work (one claim, one complete) happens
inside the span your web framework's instrumentation already opened for the request, so each
event becomes a *span event* on the current span (``idemkey.claimed``, ``idemkey.replayed``,
...) with the record digest, route, method and fence as attributes, and the request span gets
the attribute ``idemkey.outcome`` (the decision that shaped the answer: claimed, replayed,
in_flight, mismatch, takeover, store_error, unprotected, too_large, expired). Warnings (lease
lost, store error, unprotected) set the span status to error only for ``store_error``: the
others do not fail the request. A counter ``idemkey.events`` (attribute ``idemkey.event``)
counts every event.

Outside a recording span only the counter moves. Raw keys and scopes are never attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ..events import Event

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span

__all__ = ["otel_hook"]

#: Events that decide how the request is answered; the last one wins as ``idemkey.outcome``.
OUTCOMES: Final = frozenset(
    {"claimed", "takeover", "replayed", "in_flight", "mismatch", "store_error", "unprotected",
     "too_large", "expired"}
)  # fmt: skip


def otel_hook(
    meter_provider: MeterProvider | None = None,
    *,
    get_current_span: Callable[[], Span] | None = None,
) -> Callable[[Event], None]:
    """An ``on_event`` hook adding span events to the current span and counting events.

    ``meter_provider`` defaults to the global one (a no-op until the SDK is configured).
    Needs ``opentelemetry-api`` (the ``otel`` extra); the application installs and configures
    the SDK (``opentelemetry-sdk``) that records what the API receives.
    """
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.trace import Status, StatusCode
    except ImportError as exc:
        raise ImportError(
            "otel_hook needs opentelemetry-api: pip install 'idemkey-redis[otel]'"
        ) from exc

    from .. import __version__

    provider: Any = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    meter = provider.get_meter("idemkey", __version__)
    counter = meter.create_counter(
        "idemkey.events", unit="{event}", description="idemkey events by kind"
    )
    current = get_current_span or trace.get_current_span

    def on_event(event: Event) -> None:
        counter.add(1, {"idemkey.event": event.kind, "idemkey.route": event.route})
        span = current()
        if not span.is_recording():
            return
        attributes: dict[str, str | int | float] = {
            "idemkey.record": event.record,
            "idemkey.method": event.method,
            "idemkey.route": event.route,
        }
        if event.fence is not None:
            attributes["idemkey.fence"] = event.fence
        if event.redis_seconds is not None:
            attributes["idemkey.redis_seconds"] = event.redis_seconds
        if event.detail:
            attributes["idemkey.detail"] = event.detail
        span.add_event(f"idemkey.{event.kind}", attributes)
        if event.kind in OUTCOMES:
            span.set_attribute("idemkey.outcome", event.kind)
        if event.kind == "store_error":
            span.set_status(Status(StatusCode.ERROR, "idemkey store error"))

    return on_event
