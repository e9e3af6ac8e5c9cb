"""Stored values <-> bytes: msgspec MessagePack behind a one-byte format version.

The version byte lets a future release change the layout and still read (or clearly refuse)
records written by this one while they live out their retention window. Never pickle: a
record is data written by one process and read by another.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, TypeVar

import msgspec

from .errors import ConfigurationError, RecordFormatError

__all__ = [
    "FORMAT_VERSION",
    "RESULT_NOT_KEPT",
    "StoredResponse",
    "decode_response",
    "decode_value",
    "encode_payload",
    "encode_response",
    "encode_value",
]

FORMAT_VERSION: Final = 1
_VERSION_BYTE: Final = bytes([FORMAT_VERSION])

T = TypeVar("T")

#: What a guard stores when its result cannot be encoded: the work ran, its result is not kept.
#: 0xC1 is the one byte MessagePack never uses, so no encoded value can equal this.
RESULT_NOT_KEPT: Final = _VERSION_BYTE + b"\xc1"

# What msgspec raises for a value it cannot encode: an unsupported type (TypeError), an int
# outside 64 bits (OverflowError), a dict with non-str keys under deterministic order (TypeError).
_UNENCODABLE: Final = (TypeError, OverflowError, msgspec.EncodeError)


class StoredResponse(msgspec.Struct, frozen=True, array_like=True):
    """An HTTP response as stored: status, headers in order (latin-1 text), body bytes.

    ``body_kept`` is False when the body was too large or streamed: the record then holds
    status and headers only, and a replay says so instead of running the handler again.
    ``reason`` is the status line's reason phrase as the app sent it (WSGI; ``""`` when it
    has none, as in ASGI). A trailing field with a default: records written before it existed
    still decode, and an older reader ignores it.
    """

    status: Annotated[int, msgspec.Meta(ge=100, le=599)]
    headers: tuple[tuple[str, str], ...]
    body: bytes
    body_kept: bool = True
    reason: str = ""


_encoder: Final = msgspec.msgpack.Encoder()
# Deterministic order makes equal payloads (dicts built in any order) encode to equal bytes,
# so they fingerprint the same.
_payload_encoder: Final = msgspec.msgpack.Encoder(order="deterministic")
_response_decoder: Final = msgspec.msgpack.Decoder(StoredResponse)
_any_decoder: Final = msgspec.msgpack.Decoder()


def encode_response(response: StoredResponse) -> bytes:
    try:
        return _VERSION_BYTE + _encoder.encode(response)
    except _UNENCODABLE as exc:
        raise ConfigurationError(f"cannot store a response: {exc}") from exc


def decode_response(data: bytes) -> StoredResponse:
    if not data or data[0] != FORMAT_VERSION:
        _check_version(data)
    try:
        return _response_decoder.decode(memoryview(data)[1:])
    except msgspec.DecodeError as exc:
        raise RecordFormatError(f"stored response is unreadable: {exc}") from exc


def encode_value(value: object) -> bytes:
    """Encode a guard result; it must be msgspec-encodable (built-ins, Structs, dataclasses)."""
    try:
        return _VERSION_BYTE + _encoder.encode(value)
    except _UNENCODABLE as exc:
        raise ConfigurationError(
            f"cannot store a result of type {type(value).__name__}: {exc}"
        ) from exc


def decode_value(data: bytes, type: type[T] | Any = Any) -> T:
    """Decode a stored guard result, as ``type`` when given (a Struct, dataclass, ...)."""
    if not data or data[0] != FORMAT_VERSION:
        _check_version(data)
    try:
        if type is Any:
            result: T = _any_decoder.decode(memoryview(data)[1:])
            return result
        return msgspec.msgpack.decode(memoryview(data)[1:], type=type)
    except msgspec.DecodeError as exc:
        raise RecordFormatError(f"stored result is unreadable: {exc}") from exc
    except TypeError as exc:  # a type msgspec cannot decode into
        raise ConfigurationError(f"cannot decode a result as {type!r}: {exc}") from exc


def encode_payload(payload: object) -> bytes:
    """Bytes that identify a guard payload: bytes as they are, str as UTF-8, else msgpack."""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, (bytearray, memoryview)):
        return bytes(payload)
    if isinstance(payload, str):
        return payload.encode("utf-8", "surrogatepass")
    try:
        return _payload_encoder.encode(payload)
    except _UNENCODABLE as exc:
        raise ConfigurationError(
            f"cannot fingerprint a payload of type {type(payload).__name__} ({exc}); payloads "
            "must be bytes, str, or built-ins msgspec encodes: dicts with str keys, ints within "
            "64 bits; pass bytes (payload=) that identify the work"
        ) from exc


def _check_version(data: bytes) -> None:
    if not data or data[0] != FORMAT_VERSION:
        found = data[0] if data else "nothing"
        raise RecordFormatError(
            f"stored record has format {found}, this version reads {FORMAT_VERSION}"
        )
