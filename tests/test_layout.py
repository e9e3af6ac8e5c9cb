"""The package's layout: every public name of 0.2 still imports, no import cycle, no framework.

``PUBLIC_NAMES_0_2`` was generated from main before idemkey/http/ existed (every name in the
``__all__`` of each public module, underscore names left out), so a move that drops or renames
a public import fails here.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PUBLIC_NAMES_0_2: dict[str, tuple[str, ...]] = {
    "idemkey": (
        "AsyncRedisStore",
        "Call",
        "ConfigurationError",
        "Event",
        "IdemkeyError",
        "InvalidKeyError",
        "KeyReuseError",
        "LeaseLostError",
        "NoResultError",
        "Policy",
        "RecordFormatError",
        "RedisStore",
        "Replicas",
        "RequestInFlightError",
        "ResultNotStorableError",
        "StepNotStorableError",
        "StoreError",
        "StoredResponse",
        "UsageError",
        "aguard",
        "current_call",
        "guard",
        "idempotent",
    ),
    "idemkey.http": (
        "BODY_NOT_KEPT_HEADER",
        "BodyCopy",
        "Complete",
        "Exchange",
        "Headers",
        "Problem",
        "REPLAYED_HEADER",
        "Release",
        "Request",
        "Response",
        "begin",
        "problem",
        "render",
    ),
    "idemkey.routes": (
        "KnownRoute",
        "ROUTE_UNKNOWN",
        "Route",
        "RouteTable",
        "Routes",
        "Selected",
        "exempt",
        "route",
    ),
    "idemkey.errors": (
        "ConfigurationError",
        "IdemkeyError",
        "InvalidKeyError",
        "KeyReuseError",
        "LeaseLostError",
        "NoResultError",
        "ProtocolError",
        "RecordFormatError",
        "RequestInFlightError",
        "ResultNotStorableError",
        "StepNotStorableError",
        "StoreError",
        "UsageError",
    ),
    "idemkey.events": (
        "ALWAYS_LOGGED",
        "DEBUG",
        "Event",
        "EventKind",
        "RECORD_LOST_DETAIL",
        "TAKEN_OVER_DETAIL",
        "emit",
        "enabled_memo",
        "logger",
        "quiet",
        "report",
    ),
    "idemkey.policy": (
        "DEFAULT_COMPRESS_AT",
        "DEFAULT_HEADER_DENYLIST",
        "NEVER_BEGAN_STATUSES",
        "Policy",
        "Replicas",
        "credential_scope",
    ),
    "idemkey.records": (
        "Claimed",
        "Decision",
        "GUARD_METHOD",
        "InFlight",
        "MAX_KEY_LENGTH",
        "Mismatch",
        "Record",
        "Replay",
        "StoredResponse",
        "decode_response",
        "decode_value",
        "encode_response",
        "encode_value",
        "new_owner",
        "parse_key",
        "payload_fingerprint",
        "record_for",
        "request_fingerprint",
    ),
    "idemkey.testing": (
        "disabled",
        "fake_async_store",
        "fake_redis",
        "fake_store",
    ),
    "idemkey.guard": (
        "AsyncGuard",
        "Call",
        "GUARD_METHOD",
        "Guard",
        "aguard",
        "current_call",
        "guard",
        "idempotent",
    ),
    "idemkey.store": (
        "AsyncRedisStore",
        "RedisStore",
        "SCRIPTS",
        "SCRIPT_NAMES",
        "detach",
        "server_warnings",
        "uncancellable",
    ),
    "idemkey.client": (
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
        "RetriesExhaustedError",
        "Retry",
        "RetryEvent",
        "RetryHook",
        "RetryPolicy",
        "Schedule",
        "Step",
        "parse_retry_after",
    ),
    "idemkey.adapters.asgi": (
        "ASGIApp",
        "IdempotencyMiddleware",
        "Message",
        "Receive",
        "Scope",
        "Send",
    ),
    "idemkey.adapters.django": (
        "IdempotencyMiddleware",
        "idempotency_exempt",
        "idempotent",
    ),
    "idemkey.adapters.fastapi": (
        "Idempotency",
        "IdempotentRoute",
    ),
    "idemkey.adapters.flask": ("Idemkey",),
    "idemkey.adapters.starlette": ("Idempotency",),
    "idemkey.adapters.wsgi": (
        "DRAIN_SECONDS",
        "EnvironHeaders",
        "IdempotencyMiddleware",
    ),
    "idemkey.contrib": ("chain",),
    "idemkey.contrib.celery": (
        "IdempotentTask",
        "celery_key",
    ),
    "idemkey.contrib.otel": ("otel_hook",),
    "idemkey.contrib.prometheus": (
        "DEFAULT_BUCKETS",
        "prometheus_hook",
    ),
    "idemkey.contrib.sqlalchemy": (
        "AsyncEffects",
        "Effects",
        "afenced",
        "effects_table",
        "fenced",
    ),
}

FRAMEWORKS = (
    "celery", "django", "fastapi", "flask", "httpx", "opentelemetry", "prometheus_client",
    "sqlalchemy", "starlette", "werkzeug",
)  # fmt: skip


@pytest.mark.parametrize(
    ("module", "name"),
    [(module, name) for module, names in PUBLIC_NAMES_0_2.items() for name in names],
)
def test_every_public_name_of_0_2_still_imports_from_where_it_did(module: str, name: str) -> None:
    imported = importlib.import_module(module)
    assert hasattr(imported, name), f"from {module} import {name} no longer works"
    assert name in imported.__all__, f"{name} left {module}.__all__"


def test_importing_idemkey_imports_no_framework() -> None:
    code = (
        "import sys, idemkey, idemkey.http, idemkey.routes, idemkey.records, idemkey.testing\n"
        f"found = sorted(m for m in {FRAMEWORKS!r} if m in sys.modules)\n"
        "assert not found, found\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
