"""The OpenTelemetry hook, with the real SDK (in-memory exporter and metric reader)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from idemkey import Event, Policy, RedisStore, RequestInFlightError, guard
from idemkey._core import record_for
from idemkey.contrib.otel import otel_hook
from idemkey.guard import GUARD_METHOD


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()  # not installed globally: the global provider is set-once
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture
def metrics() -> Iterator[tuple[MeterProvider, InMemoryMetricReader]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield provider, reader
    provider.shutdown()


def _counts(reader: InMemoryMetricReader) -> dict[str, int]:
    data = reader.get_metrics_data()
    assert data is not None
    counts: dict[str, int] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "idemkey.events":
                    for point in metric.data.data_points:  # type: ignore[union-attr]
                        kind = str(point.attributes["idemkey.event"])  # type: ignore[index]
                        counts[kind] = counts.get(kind, 0) + int(point.value)  # type: ignore[union-attr]
    return counts


def test_span_events_and_outcome_on_the_request_span(
    real_client: redis.Redis,
    prefix: str,
    spans: tuple[TracerProvider, InMemorySpanExporter],
    metrics: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    tracer_provider, exporter = spans
    meter_provider, reader = metrics
    tracer = tracer_provider.get_tracer("test")
    store = RedisStore(real_client, Policy(prefix=prefix, on_event=otel_hook(meter_provider)))
    try:
        with tracer.start_as_current_span("first"), guard(store, "job-1") as call:
            call.save(42)
        fence = call.fence
        with tracer.start_as_current_span("retry"), guard(store, "job-1") as call:
            assert call.replayed
        # Outside any span: nothing to annotate, but the counter still moves.
        with guard(store, "job-1") as call:
            assert call.replayed
    finally:
        store.close()

    first, retry = exporter.get_finished_spans()
    digest = record_for(prefix, "", GUARD_METHOD, "", "job-1").digest
    assert [e.name for e in first.events] == ["idemkey.claimed", "idemkey.completed"]
    attributes = dict(first.events[0].attributes or {})
    redis_seconds = attributes.pop("idemkey.redis_seconds")
    assert isinstance(redis_seconds, float)
    assert 0 < redis_seconds < 5  # the claim's own round trip
    assert attributes == {
        "idemkey.record": digest,
        "idemkey.method": "GUARD",
        "idemkey.route": "",
        "idemkey.fence": fence,
    }
    assert first.attributes == {"idemkey.outcome": "claimed"}
    assert [e.name for e in retry.events] == ["idemkey.replayed"]
    assert retry.attributes == {"idemkey.outcome": "replayed"}
    assert first.status.status_code is StatusCode.UNSET
    assert _counts(reader) == {"claimed": 1, "completed": 1, "replayed": 2}


def test_in_flight_is_recorded(
    real_client: redis.Redis, prefix: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    tracer_provider, exporter = spans
    tracer = tracer_provider.get_tracer("test")
    store = RedisStore(real_client, Policy(prefix=prefix, on_event=otel_hook()))
    try:
        with guard(store, "job-2") as outer:
            with (
                tracer.start_as_current_span("duplicate"),
                pytest.raises(RequestInFlightError),
                guard(store, "job-2"),
            ):
                pass
            outer.save("done")
    finally:
        store.close()
    (duplicate,) = exporter.get_finished_spans()
    assert [e.name for e in duplicate.events] == ["idemkey.in_flight"]
    assert duplicate.attributes == {"idemkey.outcome": "in_flight"}


def test_store_error_marks_the_span(spans: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    tracer_provider, exporter = spans
    hook = otel_hook()
    with tracer_provider.get_tracer("test").start_as_current_span("request"):
        hook(Event("store_error", "cd" * 16, "/charges", "POST", detail="Redis failed"))
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.events[0].attributes is not None
    assert span.events[0].attributes["idemkey.detail"] == "Redis failed"
