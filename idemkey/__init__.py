"""idemkey: make HTTP writes and background jobs safe to retry.

Public names only; importing idemkey imports no web framework. The records and decisions the
store's methods take and return, for custom integrations, are in :mod:`idemkey.records`.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from ._codec import StoredResponse
from .errors import (
    ConfigurationError,
    EffectCommittedError,
    IdemkeyError,
    InvalidKeyError,
    JobDeadlineError,
    KeyReuseError,
    LeaseLostError,
    NoResultError,
    ProtocolError,
    RecordFormatError,
    RequestInFlightError,
    ResultNotStorableError,
    StepAttemptsExhaustedError,
    StepNotStorableError,
    StoredFailureError,
    StoreError,
    UnprotectedCallError,
    UsageError,
)
from .events import Event
from .guard import (
    Call,
    Outcome,
    StepRetry,
    aguard,
    current_call,
    guard,
    idempotent,
    step_deadline,
)
from .policy import Policy, Replicas
from .store import AsyncRedisStore, RedisStore

__all__ = [
    "AsyncRedisStore",
    "Call",
    "ConfigurationError",
    "Event",
    "IdemkeyError",
    "InvalidKeyError",
    "JobDeadlineError",
    "KeyReuseError",
    "EffectCommittedError",
    "LeaseLostError",
    "NoResultError",
    "Outcome",
    "Policy",
    "ProtocolError",
    "RecordFormatError",
    "RedisStore",
    "Replicas",
    "RequestInFlightError",
    "ResultNotStorableError",
    "StepAttemptsExhaustedError",
    "StepNotStorableError",
    "StepRetry",
    "StoreError",
    "StoredFailureError",
    "StoredResponse",
    "UnprotectedCallError",
    "UsageError",
    "aguard",
    "current_call",
    "guard",
    "idempotent",
    "step_deadline",
]

#: The distribution's name on the package index (the import package is ``idemkey``).
_DISTRIBUTION = "idemkey-redis"

try:
    # One source: the version in pyproject.toml, as the installed distribution records it.
    __version__: str = _metadata.version(_DISTRIBUTION)
except _metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
