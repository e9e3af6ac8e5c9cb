"""Which Policy fields a guard can honour: the HTTP-only ones are refused, never ignored."""

from __future__ import annotations

from typing import Final

from ..errors import ConfigurationError
from ..policy import Policy

__all__ = ["HTTP_ONLY_FIELDS", "check_guard_policy"]

# Policy fields only the HTTP adapters read: a guard has no request, header or status to apply
# them to. A guard's own policy that sets one is refused rather than silently ignored.
HTTP_ONLY_FIELDS: Final = (
    "methods",
    "require_key",
    "strict_header",
    "header",
    "max_request_bytes",
    "max_response_bytes",
    "store_error_retry_after",
    "scope",
    "mismatch_status",
    "store_server_errors",
    "release_statuses",
    "header_denylist",
    "header_allowlist",
    "retention_header",
    "mark_first_responses",
    "expired_grace",
    "mark_retryable",
)
_DEFAULTS: Final = Policy()


def check_guard_policy(policy: Policy, store_policy: Policy) -> None:
    """Refuse a guard policy with a field the guard cannot honour.

    An HTTP-only field may keep its default or the store's value (a policy derived from the
    store's with ``replace``, or one shared with the HTTP adapters); any other value would be
    ignored, so it raises :class:`ConfigurationError`. ``durability`` is the store's to set:
    the store sends every write.
    """
    for name in HTTP_ONLY_FIELDS:
        value = getattr(policy, name)
        if value != getattr(_DEFAULTS, name) and value != getattr(store_policy, name):
            raise ConfigurationError(
                f"Policy.{name} applies to HTTP requests only; guard() and @idempotent cannot "
                "honour it (leave it at its default in the guard's policy)"
            )
    if policy.durability != store_policy.durability:
        raise ConfigurationError(
            "Policy.durability is read from the store's policy: set it on the store, not on a guard"
        )
