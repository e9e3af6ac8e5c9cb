"""The response body an adapter keeps for the record while it streams to the client.

Sans-IO like :mod:`idemkey.http`, which re-exports :class:`BodyCopy`; the WSGI and ASGI
middlewares feed it their body blocks.
"""

from __future__ import annotations

from collections.abc import Iterable

from ._messages import parse_content_length

__all__ = ["BodyCopy"]


class BodyCopy:
    """The copy of a response body kept for the record while the body streams to the client.

    Dropped (the record then completes without the body, and is never run twice) once it grows
    past ``limit``, once the app streams: a second non-empty block with no Content-Length, the
    same rule for a WSGI iterable and for ASGI body messages, or on a block that is not bytes
    (a str: the server refuses it). Bytes past the declared Content-Length are left out: no
    server sends them, so a replay must not.
    """

    __slots__ = ("_cap", "_chunks", "_limit", "_size", "_sized", "declared")

    def __init__(self, limit: int) -> None:
        self._chunks: list[bytes] | None = []
        self._limit = limit
        self._cap = limit  # past it the copy is trimmed or dropped: limit, or a smaller length
        self._size = 0
        self._sized = False
        #: The declared Content-Length as a number (None: none, or malformed), once started.
        self.declared: int | None = None

    def start(self, headers: Iterable[tuple[str, str]]) -> str | None:
        """The response's headers: whether it declared its length. Returns the (first)
        Content-Length value as sent, None without one, so an adapter need not look again;
        :attr:`declared` is its number."""
        # A loop, not any(generator): no generator resumed per header.
        for name, value in headers:
            if len(name) == 14 and name.lower() == "content-length":
                self._sized = True
                try:
                    declared = self.declared = parse_content_length(value)
                except (AttributeError, TypeError):  # not text (a WSGI app's)
                    declared = self.declared = _untyped_length(value)
                if declared is not None and declared < self._limit:
                    self._cap = declared
                else:
                    self._cap = self._limit
                return value
        self._sized = False
        self.declared = None  # a WSGI app may start again (exc_info) before its body
        self._cap = self._limit
        return None

    def add(self, chunk: bytes) -> None:
        try:
            self._size += len(chunk)  # counted even once dropped: a drain stops on too_large
        except TypeError:  # not bytes, nor a str (which body() refuses): the server refuses it
            self._chunks = None
            return
        chunks = self._chunks
        if not chunk or chunks is None:
            return
        if self._size > self._cap:
            self._past_cap(chunk, self._size)
        elif chunks and not self._sized:
            self._chunks = None
        else:
            chunks.append(chunk)

    def _past_cap(self, chunk: bytes, size: int) -> None:
        """Past the limit (drop), or past the declared length within it: keep what is due."""
        declared, chunks = self.declared, self._chunks
        if declared is None or declared > self._limit or chunks is None:
            self._chunks = None
            return
        due = declared - (size - len(chunk))
        if due > 0:
            chunks.append(chunk[:due])

    def drop(self) -> None:
        self._chunks = None

    @property
    def dropped(self) -> bool:
        return self._chunks is None

    @property
    def too_large(self) -> bool:
        return self._size > self._limit

    def body(self) -> bytes | None:
        """What to store: the whole body, or None when it was dropped or is not all bytes."""
        chunks = self._chunks
        if chunks is None:
            return None
        try:
            return b"".join(chunks)
        except TypeError:  # a str block (the usual slip): the server refused it, keep no body
            return None


def _untyped_length(value: object) -> int | None:
    """A Content-Length a WSGI app gave as no text: an int is its digits, as werkzeug's server
    sends it (gunicorn refuses it); anything else (bytes: werkzeug would send its repr) none."""
    return value if type(value) is int and value >= 0 else None
