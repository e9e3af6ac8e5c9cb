"""The response body an adapter keeps for the record while it streams to the client.

Sans-IO like :mod:`idemkey.http`, which re-exports :class:`BodyCopy`; the WSGI and ASGI
middlewares feed it their body blocks.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["BodyCopy"]


class BodyCopy:
    """The copy of a response body kept for the record while the body streams to the client.

    Dropped (the record then completes without the body, and is never run twice) once it grows
    past ``limit``, or once the app streams: a second non-empty block with no Content-Length,
    the same rule for a WSGI iterable and for ASGI body messages.
    """

    __slots__ = ("_chunks", "_limit", "_size", "_sized")

    def __init__(self, limit: int) -> None:
        self._chunks: list[bytes] | None = []
        self._limit = limit
        self._size = 0
        self._sized = False

    def start(self, headers: Iterable[tuple[str, str]]) -> str | None:
        """The response's headers: whether it declared its length. Returns the (first)
        Content-Length value as sent, None without one, so an adapter need not look again."""
        # A loop, not any(generator): no generator resumed per header.
        for name, value in headers:
            if len(name) == 14 and name.lower() == "content-length":
                self._sized = True
                return value
        self._sized = False
        return None

    def add(self, chunk: bytes) -> None:
        self._size += len(chunk)  # counted even once dropped: a drain stops on too_large
        chunks = self._chunks
        if not chunk or chunks is None:
            return
        if self._size > self._limit or (chunks and not self._sized):
            self._chunks = None
        else:
            chunks.append(chunk)

    def drop(self) -> None:
        self._chunks = None

    @property
    def dropped(self) -> bool:
        return self._chunks is None

    @property
    def too_large(self) -> bool:
        return self._size > self._limit

    def body(self) -> bytes | None:
        """What to store: the whole body, or None when it was dropped."""
        return None if self._chunks is None else b"".join(self._chunks)
