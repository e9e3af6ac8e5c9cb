"""In-process stand-ins for a Redis client, to measure idemkey's own CPU per call.

Not fakeredis: fakeredis runs the Lua scripts in-process and would dominate the time. These
answer every script call instantly with a canned reply, so what is left is idemkey's work:
naming the record, fingerprinting, encoding, decoding, the lease table, events.
"""

from __future__ import annotations

import hashlib
from typing import Any

from idemkey.store import SCRIPTS

__all__ = ["AsyncFakeClient", "FakeClient", "first_call_replies", "replay_replies"]


class _Encoder:
    decode_responses = False


class _Script:
    def __init__(self, text: str) -> None:
        self.sha = hashlib.sha1(text.encode()).hexdigest()


def _sha(name: str) -> str:
    return hashlib.sha1(SCRIPTS[name].encode()).hexdigest()


def first_call_replies() -> dict[str, object]:
    """Replies for a claim that wins (fence 1) and a complete that stores."""
    return {_sha("claim"): [1, 1, 0], _sha("complete"): 1, _sha("release"): 1, _sha("renew"): 1}


def replay_replies(stored: bytes) -> dict[str, object]:
    """Replies for a claim that finds ``stored`` complete."""
    return {_sha("claim"): [2, stored], _sha("renew"): 1}


class FakeClient:
    """Enough of ``redis.Redis`` for a RedisStore: script registration and EVALSHA."""

    def __init__(self, replies: dict[str, object]) -> None:
        self._replies = replies

    def get_encoder(self) -> _Encoder:
        return _Encoder()

    def register_script(self, text: str) -> _Script:
        return _Script(text)

    def execute_command(self, *args: Any) -> object:
        return self._replies[args[1]]


class AsyncFakeClient(FakeClient):
    """The asyncio twin: ``execute_command`` is a coroutine that never suspends."""

    async def execute_command(self, *args: Any) -> object:  # type: ignore[override]
        return self._replies[args[1]]
