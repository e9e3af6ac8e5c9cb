"""Stored values <-> bytes: msgspec MessagePack behind a one-byte format version.

The version byte lets a future release change the layout and still read (or clearly refuse)
records written by this one while they live out their retention window. Never pickle: a
record is data written by one process and read by another.

Format 1 is the MessagePack as it is; format 2 the same MessagePack, zlib-compressed, written
when ``Policy(compress=...)`` asks for it and it saves bytes. Readers take both whatever their
policy says, so turning compression on or off never breaks a replay within the retention
window; the one-byte branch keeps the uncompressed read as cheap as before.
"""

from __future__ import annotations

import itertools
import operator
import zlib
from typing import Annotated, Any, Final, TypeVar

import msgspec

from .errors import ConfigurationError, RecordFormatError

__all__ = [
    "COMPRESSED_FORMAT",
    "FORMAT_VERSION",
    "MAX_INFLATED_BYTES",
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
#: Format 1's MessagePack, zlib-compressed (with zlib's header and Adler-32 check, so a
#: damaged record is refused rather than decoded into something else).
COMPRESSED_FORMAT: Final = 2
_COMPRESSED_BYTE: Final = bytes([COMPRESSED_FORMAT])
#: Level 1: a 10 KiB JSON response stores 2501 bytes where level 6 stores 2181, at half the CPU
#: (25 against 49 us), and both land in the same allocation: MEMORY USAGE 2848 for each
#: (benchmarks/RESULTS.md, "Compression").
_ZLIB_LEVEL: Final = 1
#: The most a compressed record may inflate to. Writers compress no larger record (it is stored
#: as format 1), readers refuse one that would inflate past it: a damaged or forged record
#: (a decompression bomb) costs at most this much memory. A constant, not read from the
#: policy, so that no policy change can make a record written before it unreadable.
MAX_INFLATED_BYTES: Final = 16 << 20

T = TypeVar("T")

#: What a guard stores when its result cannot be encoded: the work ran, its result is not kept.
#: 0xC1 is the one byte MessagePack never uses, so no encoded value can equal this.
RESULT_NOT_KEPT: Final = _VERSION_BYTE + b"\xc1"

# What msgspec raises for a value it cannot encode: an unsupported type (TypeError), an int
# outside 64 bits (OverflowError), a dict with non-str keys under deterministic order (TypeError),
# a str with a lone surrogate (UnicodeEncodeError: json.loads gives one for a client's
# "\ud800"), a container that holds itself or nests past the stack (RecursionError).
_UNENCODABLE: Final = (
    TypeError,
    OverflowError,
    UnicodeEncodeError,
    RecursionError,
    msgspec.EncodeError,
)


class StoredResponse(msgspec.Struct, frozen=True, array_like=True):
    """An HTTP response as stored: status (200-599), headers in order (latin-1 text), body bytes.

    ``body_kept`` is False when the body was too large or streamed: the record then holds
    status and headers only, and a replay says so instead of running the handler again.
    ``reason`` is the status line's reason phrase as the app sent it (WSGI; ``""`` when it
    has none, as in ASGI). A trailing field with a default: records written before it existed
    still decode, and an older reader ignores it.
    """

    # Not a 1xx: an interim answer, never stored (plan_for); a replay of 101 or 103 drops the
    # connection under waitress and uvicorn, on every retry.
    status: Annotated[int, msgspec.Meta(ge=200, le=599)]
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


def encode_response(response: StoredResponse, compress_at: int | None = None) -> bytes:
    """Encode a response; compressed when it encodes to ``compress_at`` bytes or more (None:
    never) and compressing saves bytes. A body the app already encoded (``Content-Encoding``)
    is not tried: it would not shrink."""
    try:
        encoded = _encoder.encode(response)
    except _UNENCODABLE as exc:
        raise ConfigurationError(f"cannot store a response: {exc}") from exc
    if (
        compress_at is not None
        and len(encoded) >= compress_at
        and not _content_encoded(response.headers)
    ):
        return _compressed(encoded)
    return _VERSION_BYTE + encoded


def decode_response(data: bytes) -> StoredResponse:
    # _msgpack's first case inline: format 1, the usual one, costs no call.
    packed = memoryview(data)[1:] if data and data[0] == FORMAT_VERSION else _msgpack(data)
    try:
        response = _response_decoder.decode(packed)
    except msgspec.DecodeError as exc:
        raise RecordFormatError(f"stored response is unreadable: {exc}") from exc
    if not _sendable(response):
        raise RecordFormatError(
            "stored response is unreadable: a header name that is no token or is hop-by-hop, a "
            "header value with leading or trailing whitespace, or a header value or reason "
            "phrase with a control character (CR, LF, NUL, DEL...; HTAB aside) or a character "
            "past latin-1"
        )
    return response


# A stored head is input (a record written by anything but idemkey): sent as it is, a CR or LF
# would split the replay, a colon in a name add a header, a character past latin-1 fail as the
# server encodes it. A name is an RFC 9110 token; a value or reason phrase any latin-1 text but
# the control characters (HTAB aside), no stricter than the servers that sent the first answer.
# What a server refuses to send would fail every retry too: a hop-by-hop name (waitress answers
# 500; the default header_denylist never stores one), a value h11 refuses (uvicorn and hypercorn
# drop the connection): SP or HTAB first or last, or a VT or FF anywhere (h11's field-vchar,
# [^\x00\s] on bytes); and a control character in a value or reason phrase, which h11,
# werkzeug's server and waitress send but gunicorn refuses (500: its HEADER_VALUE_RE and
# STATUS_RE take SP, HTAB, VCHAR and obs-text only; granian's ASGI interface answers 500 too,
# its WSGI one drops the line). Checked on whole joined strings by C calls, a fixed number for
# any number of headers: a regular expression per field cost a replay about twice as much,
# cold, and one over the joined values (a character class, 0.87 us on a 186-character head)
# or str.isprintable (0.59 us, and it refuses HTAB and obs-text) more than the latin-1 encoding
# of the values and reason phrase with every refused control byte translated to NUL, then one
# search for NUL (0.18 us; 0.10 on 38 characters), which also refuses a character past latin-1
# (the encoding fails). The five `in` tests and the latin-1 test it replaced took 0.08 us.
_NAME: Final = operator.itemgetter(0)
_VALUE: Final = operator.itemgetter(1)
#: The token characters that are neither letters nor digits, removed by str.translate.
_TOKEN_MARKS: Final = str.maketrans("", "", "!#$%&'*+-.^_`|~")
#: RFC 9110 7.6.1's, and the ones waitress and wsgiref refuse from an app ("trailers").
HOP_BY_HOP: Final = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
     "te", "trailer", "trailers", "transfer-encoding", "upgrade"}
)  # fmt: skip
#: str.strip's argument for each value (map passes it beside the value): RFC 9110's OWS.
_OWS: Final = itertools.repeat(" \t")
#: The control bytes a value or reason phrase may not hold besides NUL (all but HTAB: CR, LF,
#: VT, FF, ... US, DEL), and the bytes.translate table that makes each of them a NUL.
_REFUSED: Final = bytes([*range(0x01, 0x09), *range(0x0A, 0x20), 0x7F])
_CONTROLS: Final = bytes.maketrans(_REFUSED, bytes(len(_REFUSED)))


def _sendable(response: StoredResponse) -> bool:
    """Whether a replay can send ``response``'s head as it is stored."""
    headers = response.headers
    text = response.reason
    if headers:
        names = "".join(map(_NAME, headers))
        if not names.isascii() or "" in map(_NAME, headers):
            return False
        if not names.replace("-", "").isalnum():  # a name with other marks, or past tokens
            rest = names.translate(_TOKEN_MARKS)
            if rest and not rest.isalnum():
                return False
        if not HOP_BY_HOP.isdisjoint(map(str.lower, map(_NAME, headers))):
            return False
        values = "".join(map(_VALUE, headers))
        # Equal: no value loses a character to strip, so none starts or ends with OWS.
        if "".join(map(str.strip, map(_VALUE, headers), _OWS)) != values:
            return False
        text = values + text
    try:
        # An int: bytes.__contains__ tries its argument as an int first, and a bytes one
        # costs a raised and cleared TypeError (about 120 ns) before the search.
        return 0 not in text.encode("latin-1").translate(_CONTROLS)
    except UnicodeEncodeError:  # a character past latin-1
        return False


def encode_value(value: object, compress_at: int | None = None) -> bytes:
    """Encode a guard result; it must be msgspec-encodable (built-ins, Structs, dataclasses).

    Compressed when it encodes to ``compress_at`` bytes or more (None: never) and
    compressing saves bytes.
    """
    try:
        encoded = _encoder.encode(value)
    except _UNENCODABLE as exc:
        raise ConfigurationError(
            f"cannot store a result of type {type(value).__name__}: {exc}"
        ) from exc
    if compress_at is not None and len(encoded) >= compress_at:
        return _compressed(encoded)
    return _VERSION_BYTE + encoded


def decode_value(data: bytes, type: type[T] | Any = Any) -> T:
    """Decode a stored guard result, as ``type`` when given (a Struct, dataclass, ...)."""
    # _msgpack's first case inline: format 1, the usual one, costs no call.
    packed = memoryview(data)[1:] if data and data[0] == FORMAT_VERSION else _msgpack(data)
    try:
        if type is Any:
            result: T = _any_decoder.decode(packed)
            return result
        return msgspec.msgpack.decode(packed, type=type)
    except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested too deep
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


def _msgpack(data: bytes) -> memoryview | bytes:
    """The MessagePack a record holds, after its format byte (inflated for format 2)."""
    if data and data[0] == FORMAT_VERSION:
        return memoryview(data)[1:]
    if data and data[0] == COMPRESSED_FORMAT:
        return _inflated(data)
    found = data[0] if data else "nothing"
    raise RecordFormatError(
        f"stored record has format {found}, this version reads {FORMAT_VERSION} and "
        f"{COMPRESSED_FORMAT}"
    )


def _compressed(encoded: bytes) -> bytes:
    """Format 2 when it is smaller than format 1 and inflates within the cap, else format 1."""
    if len(encoded) <= MAX_INFLATED_BYTES:
        packed = zlib.compress(encoded, _ZLIB_LEVEL)
        if len(packed) < len(encoded):
            return _COMPRESSED_BYTE + packed
    return _VERSION_BYTE + encoded


def _inflated(data: bytes) -> bytes:
    inflater = zlib.decompressobj()
    try:
        # max_length caps what one call may produce; what it could not consume stays behind.
        # One byte of room past the cap: a record of exactly the cap still reaches its end.
        packed = inflater.decompress(memoryview(data)[1:], MAX_INFLATED_BYTES + 1)
    except zlib.error as exc:
        raise RecordFormatError(f"stored compressed record is corrupt: {exc}") from exc
    if inflater.unconsumed_tail or len(packed) > MAX_INFLATED_BYTES:
        raise RecordFormatError(
            f"stored compressed record inflates past {MAX_INFLATED_BYTES} bytes: refused"
        )
    if not inflater.eof or inflater.unused_data:
        raise RecordFormatError("stored compressed record is truncated or has trailing bytes")
    return packed


def _content_encoded(headers: tuple[tuple[str, str], ...]) -> bool:
    """Whether the app sent an encoded body (gzip, br, ...): it would not shrink again."""
    for name, value in headers:
        if len(name) == 16 and name.lower() == "content-encoding":
            return value.strip().lower() != "identity"
    return False
