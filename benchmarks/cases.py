"""The benchmark cases: each is one operation the interleaved runner times, round after round.

Core cases (always run, and the only ones in ``--quick``):

* ``redis.ping`` / ``aredis.ping``: one PING round trip, the network's unit.
* ``floor.first`` / ``floor.replay`` (and ``afloor.*``): the bare floor
  (docs/design.md#performance-targets), the work any correct design must do, issued as bare
  ``execute_command("EVALSHA", sha, 1, ...)`` calls with idemkey's own Lua scripts and every
  argument computed in advance: claim + complete for a first call, one claim for a replay.
* ``guard.first`` / ``guard.replay`` (and ``aguard.*``): the same work through the public API.
* ``floor.steps3`` / ``guard.steps3``: a first call with three recovery points (``call.step``):
  the bare floor is claim + 3 checkpoint EVALSHAs + complete, i.e. one round trip per step.
* ``cpu.guard.*`` / ``cpu.aguard.*``: the same calls against an in-process client that answers
  instantly, i.e. idemkey's own CPU per call.

Each first-call case uses a fresh key every round; each replay case replays one record.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from idemkey import AsyncRedisStore, Policy, RedisStore, aguard, guard
from idemkey._codec import encode_value
from idemkey._core import owner_tag, payload_fingerprint, record_for
from idemkey.guard import GUARD_METHOD
from idemkey.guard._steps import step_field

from .fakes import AsyncFakeClient, FakeClient, first_call_replies, replay_replies

__all__ = ["PAYLOAD", "RESULT", "Case", "Context", "core_cases", "naive_cases"]

#: What every guarded call identifies its work by, and the result it stores: a small JSON-ish
#: order, as a payment handler would see.
PAYLOAD = b'{"invoice":"inv_42","amount":1999,"currency":"eur","customer":"cus_9"}'
RESULT: dict[str, Any] = {"id": "ch_3Mtw", "status": "succeeded", "amount": 1999}
#: The steps of the 3-step case and what each returns (a small reservation-like dict).
STEP_NAMES = ("reserve", "charge", "ship")
STEP_RESULT: dict[str, Any] = {"id": "hold_81", "ok": True}


@dataclass(eq=False)
class Case:
    """One timed operation. ``run(i)`` does round ``i`` (a coroutine function when async)."""

    name: str
    group: str
    run: Callable[[int], Any]
    is_async: bool = False
    #: The case whose statistics this one is compared with ("x floor").
    floor: str | None = None
    #: The PING case of the same flavour (sync or async).
    ping: str | None = None
    #: The same work without idemkey (an HTTP app alone), to report the latency idemkey adds.
    baseline: str | None = None
    #: A real-server HTTP case: the same app under the same server doing the floor's Redis
    #: work (benchmarks/httpcases.py), the floor of what this case adds ("added x floor").
    server_floor: str | None = None
    core: bool = False
    note: str = ""
    #: Cases that must each see an idemkey record to replay must be prepared first.
    prepare: Callable[[], Any] | None = None


@dataclass(eq=False)
class Context:
    """What the cases share: the clients, a prefix unique to this run, and the key space."""

    client: Any  # redis.Redis
    aclient: Any  # redis.asyncio.Redis
    prefix: str
    total_rounds: int
    policy: Policy = field(init=False)
    #: Stores made for this run; ``close()`` stops their heartbeats.
    stores: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.policy = Policy(prefix=self.prefix, ttl=900.0, lease=30.0)

    async def close(self) -> None:
        for store in self.stores:
            if isinstance(store, AsyncRedisStore):
                await store.aclose()
            else:
                store.close()

    def keys(self, case: str) -> list[str]:
        """A fresh key for every round of ``case``, made before any timing starts."""
        return [f"{case}:{i}" for i in range(self.total_rounds)]


def core_cases(ctx: Context) -> list[Case]:
    """PING, the bare floor, guard/aguard through Redis, and own CPU with a fake client."""
    client, aclient, policy = ctx.client, ctx.aclient, ctx.policy
    store = RedisStore(client, policy)
    astore = AsyncRedisStore(aclient, policy)
    claim_sha = store._scripts["claim"].sha
    complete_sha = store._scripts["complete"].sha
    fp = payload_fingerprint(PAYLOAD)
    owner = secrets.token_hex(16)
    tag = owner_tag(owner)
    lease_ms, ttl_ms = policy.lease_ms, policy.ttl_ms
    stored = encode_value(RESULT)

    def records(case: str) -> list[str]:
        out = []
        for key in ctx.keys(case):
            rec = record_for(ctx.prefix, "", GUARD_METHOD, "", key)
            out.append(rec.key)
        return out

    # The floor: all arguments ready, nothing but the script calls left.
    floor_first = records("floor.first")
    afloor_first = records("afloor.first")
    replay_rec = record_for(ctx.prefix, "", GUARD_METHOD, "", "replay")
    replay_args = (replay_rec.key, fp, owner, lease_ms, ttl_ms)

    def prepare_replay() -> None:
        with guard(store, "replay", payload=PAYLOAD) as call:
            if not call.replayed:
                call.save(RESULT)

    def ping(i: int) -> None:
        client.execute_command("PING")

    async def aping(i: int) -> None:
        await aclient.execute_command("PING")

    def floor_first_run(i: int) -> None:
        key = floor_first[i]
        client.execute_command("EVALSHA", claim_sha, 1, key, fp, owner, lease_ms, ttl_ms)
        client.execute_command("EVALSHA", complete_sha, 1, key, owner, stored, ttl_ms, tag)

    def floor_replay_run(i: int) -> None:
        client.execute_command("EVALSHA", claim_sha, 1, *replay_args)

    async def afloor_first_run(i: int) -> None:
        key = afloor_first[i]
        await aclient.execute_command("EVALSHA", claim_sha, 1, key, fp, owner, lease_ms, ttl_ms)
        await aclient.execute_command("EVALSHA", complete_sha, 1, key, owner, stored, ttl_ms, tag)

    async def afloor_replay_run(i: int) -> None:
        await aclient.execute_command("EVALSHA", claim_sha, 1, *replay_args)

    # Recovery points: a 3-step call costs one checkpoint EVALSHA per step on top of a first
    # call; its floor is the same five bare scripts (claim, 3 checkpoints, complete).
    checkpoint_sha = store._scripts["checkpoint"].sha
    floor_steps = records("floor.steps3")
    steps_keys = ctx.keys("guard.steps3")
    step_fields = [step_field(name) for name in STEP_NAMES]
    result = encode_value(STEP_RESULT)

    def floor_steps_run(i: int) -> None:
        key = floor_steps[i]
        client.execute_command("EVALSHA", claim_sha, 1, key, fp, owner, lease_ms, ttl_ms)
        for name in step_fields:
            client.execute_command("EVALSHA", checkpoint_sha, 1, key, owner, name, result)
        client.execute_command("EVALSHA", complete_sha, 1, key, owner, stored, ttl_ms, tag)

    def step() -> dict[str, Any]:
        return STEP_RESULT

    def prepare_steps() -> None:
        # Loads the scripts the floor sends bare (claim, checkpoint, complete).
        with guard(store, "steps-prepare", payload=PAYLOAD) as call:
            if not call.replayed:
                call.step("load", step)
                call.save(RESULT)

    def guard_steps(i: int) -> None:
        with guard(store, steps_keys[i], payload=PAYLOAD) as call:
            if not call.replayed:
                for name in STEP_NAMES:
                    call.step(name, step)
                call.save(RESULT)

    guard_keys = ctx.keys("guard.first")
    aguard_keys = ctx.keys("aguard.first")

    def guard_first(i: int) -> None:
        with guard(store, guard_keys[i], payload=PAYLOAD) as call:
            if not call.replayed:
                call.save(RESULT)

    def guard_replay(i: int) -> None:
        with guard(store, "replay", payload=PAYLOAD) as call:
            if not call.replayed:
                raise AssertionError("guard.replay did not replay")
            call.result  # noqa: B018 - the decoded value is part of a replay's cost

    async def aguard_first(i: int) -> None:
        async with aguard(astore, aguard_keys[i], payload=PAYLOAD) as call:
            if not call.replayed:
                call.save(RESULT)

    async def aguard_replay(i: int) -> None:
        async with aguard(astore, "replay", payload=PAYLOAD) as call:
            if not call.replayed:
                raise AssertionError("aguard.replay did not replay")
            call.result  # noqa: B018

    # Own CPU: the same calls against clients that answer at once.
    cpu_first = RedisStore(FakeClient(first_call_replies()), policy)
    cpu_replay = RedisStore(FakeClient(replay_replies(stored)), policy)
    acpu_first = AsyncRedisStore(AsyncFakeClient(first_call_replies()), policy)
    acpu_replay = AsyncRedisStore(AsyncFakeClient(replay_replies(stored)), policy)
    ctx.stores += [store, astore, cpu_first, cpu_replay, acpu_first, acpu_replay]
    cpu_keys = ctx.keys("cpu.guard.first")

    def cpu_guard_first(i: int) -> None:
        with guard(cpu_first, cpu_keys[i], payload=PAYLOAD) as call:
            call.save(RESULT)

    def cpu_guard_replay(i: int) -> None:
        with guard(cpu_replay, "replay", payload=PAYLOAD) as call:
            call.result  # noqa: B018

    async def cpu_aguard_first(i: int) -> None:
        async with aguard(acpu_first, cpu_keys[i], payload=PAYLOAD) as call:
            call.save(RESULT)

    async def cpu_aguard_replay(i: int) -> None:
        async with aguard(acpu_replay, "replay", payload=PAYLOAD) as call:
            call.result  # noqa: B018

    sync, asyn = "redis.ping", "aredis.ping"
    return [
        Case("redis.ping", "redis", ping, core=True, ping=sync, note="PING round trip"),
        Case("floor.first", "floor", floor_first_run, core=True, ping=sync,
             note="bare EVALSHA claim + complete"),
        Case("floor.replay", "floor", floor_replay_run, core=True, ping=sync,
             note="bare EVALSHA claim (replay)", prepare=prepare_replay),
        Case("guard.first", "idemkey", guard_first, core=True, floor="floor.first", ping=sync,
             note="guard(): claim, save, complete"),
        Case("guard.replay", "idemkey", guard_replay, core=True, floor="floor.replay", ping=sync,
             note="guard(): replay, decoded", prepare=prepare_replay),
        Case("floor.steps3", "floor", floor_steps_run, core=True, ping=sync,
             note="bare EVALSHA claim + 3 checkpoints + complete", prepare=prepare_steps),
        Case("guard.steps3", "idemkey", guard_steps, core=True, floor="floor.steps3", ping=sync,
             note="guard(): claim, 3 call.step, save, complete"),
        Case("aredis.ping", "redis", aping, is_async=True, core=True, ping=asyn,
             note="PING round trip (asyncio)"),
        Case("afloor.first", "floor", afloor_first_run, is_async=True, core=True, ping=asyn,
             note="bare EVALSHA claim + complete (asyncio)"),
        Case("afloor.replay", "floor", afloor_replay_run, is_async=True, core=True, ping=asyn,
             note="bare EVALSHA claim (asyncio)", prepare=prepare_replay),
        Case("aguard.first", "idemkey", aguard_first, is_async=True, core=True,
             floor="afloor.first", ping=asyn, note="aguard(): claim, save, complete"),
        Case("aguard.replay", "idemkey", aguard_replay, is_async=True, core=True,
             floor="afloor.replay", ping=asyn, note="aguard(): replay, decoded",
             prepare=prepare_replay),
        Case("cpu.guard.first", "cpu", cpu_guard_first, core=True,
             note="own CPU, in-process fake client"),
        Case("cpu.guard.replay", "cpu", cpu_guard_replay, core=True,
             note="own CPU, in-process fake client"),
        Case("cpu.aguard.first", "cpu", cpu_aguard_first, is_async=True, core=True,
             note="own CPU, in-process fake client"),
        Case("cpu.aguard.replay", "cpu", cpu_aguard_replay, is_async=True, core=True,
             note="own CPU, in-process fake client"),
    ]  # fmt: skip


def naive_cases(ctx: Context) -> list[Case]:
    """The textbook implementation: ``SET key placeholder NX PX``, then ``SET`` or ``GET``.

    No fingerprint check, no fencing, no owner check on completion; two round trips for a
    first call and for a replay. It shows what "just use SET NX" costs.
    """
    client = ctx.client
    ttl_ms, lease_ms = ctx.policy.ttl_ms, ctx.policy.lease_ms
    keys = [f"{ctx.prefix}:naive:{k}" for k in ctx.keys("naive")]
    replay_key = f"{ctx.prefix}:naive:replay"

    def call(key: str) -> Any:
        if client.set(key, b"", nx=True, px=lease_ms):
            result = RESULT
            client.set(key, json.dumps(result).encode(), px=ttl_ms)
            return result
        stored = client.get(key)
        if not stored:
            raise RuntimeError("naive: in flight")
        return json.loads(stored)

    def prepare() -> None:
        call(replay_key)

    def first(i: int) -> None:
        call(keys[i])

    def replay(i: int) -> None:
        call(replay_key)

    return [
        Case("peer.naive.first", "peer", first, floor="floor.first", ping="redis.ping",
             note="SET NX, then SET (no fingerprint)"),
        Case("peer.naive.replay", "peer", replay, floor="floor.replay", ping="redis.ping",
             note="SET NX fails, then GET", prepare=prepare),
    ]  # fmt: skip
