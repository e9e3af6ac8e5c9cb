"""Other idempotency libraries on the same Redis, doing the same work as ``guard``.

* aws-lambda-powertools' Redis persistence layer (``idempotent_function`` with
  ``CachePersistenceLayer``, the new name of ``RedisCachePersistenceLayer``), sync, compared
  with ``guard``. Payload validation is off: in aws-lambda-powertools 3.37 the Redis layer
  drops the validation hash when it stores the result (``_update_record`` rewrites the record
  without it), so with ``payload_validation_jmespath`` every replay raises
  ``IdempotencyValidationError``. idemkey checks the payload on every call; powertools here
  does not, which only makes it cheaper.
* idemkit's ``RedisBackend`` through its ``idempotent`` decorator (asyncio only), compared
  with ``aguard``, with a validation fingerprint over the same payload.

A peer that is not installed is reported as skipped with the import error, never faked.
Install them with ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import warnings
from typing import Any

from .cases import PAYLOAD, RESULT, Case, Context

__all__ = ["idemkit_cases", "powertools_cases"]


class _LambdaContext:
    """What powertools reads from a Lambda context: the time left (it sets the lease by it)."""

    function_name = "idemkey-bench"
    memory_limit_in_mb = 128
    invoked_function_arn = "arn:aws:lambda:eu-west-1:000000000000:function:idemkey-bench"
    aws_request_id = "bench"

    def get_remaining_time_in_millis(self) -> int:
        return 300_000


def powertools_cases(ctx: Context) -> tuple[list[Case], str | None]:
    """Cases for powertools, or ([], the reason it is skipped)."""
    try:
        from aws_lambda_powertools.utilities.idempotency import (
            IdempotencyConfig,
            idempotent_function,
        )
        from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
            CachePersistenceLayer,
        )
    except ImportError as exc:
        return [], f"aws-lambda-powertools[redis] is not installed ({exc})"

    layer = CachePersistenceLayer(client=ctx.client)
    config = IdempotencyConfig(
        event_key_jmespath="key",
        expires_after_seconds=int(ctx.policy.ttl),
        use_local_cache=False,
    )
    config.register_lambda_context(_LambdaContext())
    payload = PAYLOAD.decode()

    @idempotent_function(
        data_keyword_argument="order",
        persistence_store=layer,
        config=config,
        key_prefix=f"{ctx.prefix}:powertools",
    )
    def charge(order: dict[str, str]) -> dict[str, Any]:
        return RESULT

    keys = ctx.keys("powertools")
    replay = {"key": "replay", "payload": payload}

    def first(i: int) -> None:
        charge(order={"key": keys[i], "payload": payload})

    def again(i: int) -> None:
        charge(order=replay)

    def prepare() -> None:
        charge(order=replay)

    return [
        Case("peer.powertools.first", "peer", first, floor="floor.first", ping="redis.ping",
             note="aws-lambda-powertools Redis layer"),
        Case("peer.powertools.replay", "peer", again, floor="floor.replay", ping="redis.ping",
             note="aws-lambda-powertools Redis layer", prepare=prepare),
    ], None  # fmt: skip


def idemkit_cases(ctx: Context) -> tuple[list[Case], str | None]:
    """Cases for idemkit's Redis backend, or ([], the reason it is skipped)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from idemkit import MethodConfig, RedisBackend, idempotent
    except ImportError as exc:
        return [], f"idemkit is not installed ({exc})"

    backend = RedisBackend(ctx.aclient, namespace=f"{ctx.prefix}:idemkit")
    config = MethodConfig(
        scope=lambda: "bench",
        validation_fingerprint=lambda arguments: PAYLOAD,
        expires_after_seconds=ctx.policy.ttl,
    )

    @idempotent(backend=backend, config=config)
    async def charge(order: bytes) -> dict[str, Any]:
        return RESULT

    keys = ctx.keys("idemkit")

    async def first(i: int) -> None:
        await charge(PAYLOAD, idempotency_key=keys[i])

    async def again(i: int) -> None:
        await charge(PAYLOAD, idempotency_key="replay")

    async def prepare() -> None:
        await charge(PAYLOAD, idempotency_key="replay")

    return [
        Case("peer.idemkit.first", "peer", first, is_async=True, floor="afloor.first",
             ping="aredis.ping", note="idemkit RedisBackend (asyncio)"),
        Case("peer.idemkit.replay", "peer", again, is_async=True, floor="afloor.replay",
             ping="aredis.ping", note="idemkit RedisBackend (asyncio)", prepare=prepare),
    ], None  # fmt: skip
