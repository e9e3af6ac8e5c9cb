"""Stored values <-> bytes: a version byte, then msgspec MessagePack; never pickle."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from idemkey import ConfigurationError, RecordFormatError, StoredResponse, StoreError
from idemkey._codec import FORMAT_VERSION, encode_payload
from idemkey.records import decode_response, decode_value, encode_response, encode_value


class Receipt(msgspec.Struct):
    charge_id: str
    amount: int


@dataclasses.dataclass
class DataReceipt:
    charge_id: str
    amount: int


TOKEN = "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
#: The control characters gunicorn refuses in a value or reason phrase (all but HTAB): its
#: HEADER_VALUE_RE and STATUS_RE take SP, HTAB, VCHAR and obs-text only.
CONTROLS = "".join(map(chr, [*range(0x09), *range(0x0A, 0x20), 0x7F]))
#: What a reason phrase may hold: latin-1 but those controls (CR, LF and NUL among them).
FIELD_TEXT = "".join(chr(c) for c in range(256) if chr(c) not in CONTROLS)
#: What a header value may hold besides SP and HTAB between other characters: latin-1 but the
#: controls gunicorn refuses and the whitespace h11 refuses (``[^\x00\s]`` on bytes).
VALUE_CHARS = "".join(chr(c) for c in range(256) if chr(c) not in CONTROLS + "\t ")
#: The names no server sends from an app (RFC 9110 7.6.1, waitress's and wsgiref's lists).
HOP_BY_HOP = [
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
    "TE", "Trailer", "Trailers", "Transfer-Encoding", "Upgrade",
]  # fmt: skip
values = st.one_of(
    st.just(""),
    st.builds(
        lambda first, rest: first + "".join(gap + chars for gap, chars in rest),
        st.text(st.sampled_from(VALUE_CHARS), min_size=1, max_size=10),
        st.lists(
            st.tuples(
                st.text(st.sampled_from(" \t"), min_size=1, max_size=3),
                st.text(st.sampled_from(VALUE_CHARS), min_size=1, max_size=10),
            ),
            max_size=3,
        ),
    ),
)
headers = st.lists(
    st.tuples(
        st.text(st.sampled_from(TOKEN), min_size=1, max_size=20).filter(
            lambda name: name.lower() not in {n.lower() for n in HOP_BY_HOP}
        ),
        values,
    ),
    max_size=5,
).map(tuple)


@given(st.integers(200, 599), headers, st.binary(), st.booleans())
def test_responses_round_trip_byte_for_byte(
    status: int, hdrs: tuple[tuple[str, str], ...], body: bytes, body_kept: bool
) -> None:
    response = StoredResponse(status, hdrs, body, body_kept)
    data = encode_response(response)
    assert data[0] == FORMAT_VERSION
    assert decode_response(data) == response
    assert decode_response(data).body == body


@given(
    st.text(min_size=1, max_size=20).filter(lambda t: not set(t) <= set(TOKEN)),
    st.text(max_size=40).filter(lambda t: not set(t) <= set(FIELD_TEXT)),
    st.sampled_from(["name", "value", "reason"]),
)
def test_a_head_a_replay_could_not_send_as_it_is_is_refused(
    bad_name: str, bad_text: str, where: str
) -> None:
    """A stored record is input: a header name that is no token, or a value or reason with a
    CR, LF, NUL or a character past latin-1, would split or break the replay."""
    name, value, reason = "X-A", "1", "Created"
    if where == "name":
        name = bad_name
    elif where == "value":
        value = bad_text
    else:
        reason = bad_text
    data = encode_response(StoredResponse(201, ((name, value),), b"{}", reason=reason))
    with pytest.raises(RecordFormatError, match="unreadable"):
        decode_response(data)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        *[(name, "close") for name in HOP_BY_HOP],
        ("connection", "close"),
        ("TRANSFER-ENCODING", "chunked"),
        ("X-Note", " padded"),
        ("X-Note", "padded "),
        ("X-Note", "\tpadded"),
        ("X-Note", "padded\t"),
        ("X-Note", " "),
        ("X-Note", "a\x0bb"),
        ("X-Note", "a\x0cb"),
        # h11 sends these (uvicorn, hypercorn), gunicorn answers 500 for each on every replay.
        ("X-Note", "a\x01b"),
        ("X-Note", "a\x7fb"),
        ("X-Note", "a\x1fb"),
        ("X-Note", "\x08"),
        ("X-Note", "a\x1bb"),
    ],
)
def test_a_head_no_server_sends_as_it_is_is_refused(name: str, value: str) -> None:
    """Stored by a foreign writer: a hop-by-hop line (waitress answers 500 for it, the default
    header_denylist never stores it) or a value h11 refuses (uvicorn drops the connection)
    would fail every retry for the record's whole retention."""
    data = encode_response(StoredResponse(201, (("X-A", "1"), (name, value)), b"{}"))
    with pytest.raises(RecordFormatError, match="unreadable"):
        decode_response(data)


def gunicorn_rule(name: str) -> re.Pattern[str]:
    """gunicorn's own regular expression ``name`` (``gunicorn.http.wsgi``), the oracle."""
    found: re.Pattern[str] | None = getattr(pytest.importorskip("gunicorn.http.wsgi"), name, None)
    if found is None:
        pytest.skip(f"this gunicorn has no {name}")
    return found


@given(st.text(st.characters(max_codepoint=0xFF), max_size=12))
def test_a_stored_value_reads_exactly_when_h11_and_gunicorn_would_send_it(value: str) -> None:
    """The value rule is what both h11 (uvicorn's and hypercorn's HTTP/1.1) and gunicorn send:
    h11's field-content, SP and HTAB only between other characters, and no NUL, CR, LF, VT or
    FF; gunicorn's SP, HTAB, VCHAR and obs-text, so no other control character either."""
    from h11._headers import _field_value_re

    data = encode_response(StoredResponse(201, (("X-Note", value),), b"{}"))
    sent = gunicorn_rule("HEADER_VALUE_RE").fullmatch(value)
    if _field_value_re.fullmatch(value.encode("latin-1")) and sent:
        assert decode_response(data).headers == (("X-Note", value),)
    else:
        with pytest.raises(RecordFormatError, match="unreadable"):
            decode_response(data)


@given(st.text(st.characters(max_codepoint=0xFF), max_size=12))
def test_a_stored_reason_reads_exactly_when_gunicorn_would_send_it(reason: str) -> None:
    """gunicorn refuses a status line whose reason phrase holds a control character but HTAB
    (its STATUS_RE), which werkzeug's server and waitress send as they are."""
    data = encode_response(StoredResponse(201, (), b"{}", reason=reason))
    if gunicorn_rule("STATUS_RE").fullmatch(f"201 {reason}"):
        assert decode_response(data).reason == reason
    else:
        with pytest.raises(RecordFormatError, match="unreadable"):
            decode_response(data)


def test_values_sent_as_they_are_stay_readable() -> None:
    inner = "a \t b; q=\x85\xa0\xff"  # obs-text and inner OWS: no server refuses them
    stored = StoredResponse(201, (("X-Note", inner), ("Content-Type", ""), ("Tea", "1")), b"")
    assert decode_response(encode_response(stored)) == stored


def test_values_nested_past_the_decoders_depth_are_unreadable_not_a_recursion_error() -> None:
    deep = bytes([FORMAT_VERSION]) + b"\x91" * 10_000 + b"\xc0"
    with pytest.raises(RecordFormatError, match="unreadable"):
        decode_value(deep)
    with pytest.raises(RecordFormatError, match="unreadable"):
        decode_value(deep, list)


def test_body_kept_defaults_to_true() -> None:
    assert StoredResponse(200, (), b"").body_kept is True


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=10,
)


@given(json_values)
def test_values_round_trip(value: Any) -> None:
    assert decode_value(encode_value(value)) == value


def test_values_decode_into_structs_and_dataclasses() -> None:
    data = encode_value(Receipt("ch_1", 4200))
    assert decode_value(data, Receipt) == Receipt("ch_1", 4200)
    assert decode_value(data) == {"charge_id": "ch_1", "amount": 4200}
    assert decode_value(encode_value(DataReceipt("ch_1", 4200)), DataReceipt) == DataReceipt(
        "ch_1", 4200
    )


def test_a_value_of_the_wrong_shape_is_a_record_format_error() -> None:
    with pytest.raises(RecordFormatError, match="unreadable"):
        decode_value(encode_value({"charge_id": "ch_1"}), Receipt)


def test_an_unencodable_value_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="object"):
        encode_value(object())


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, [2**70], {"n": 2**70}])
def test_an_int_beyond_64_bits_is_a_configuration_error_not_an_overflow(value: object) -> None:
    with pytest.raises(ConfigurationError, match="int"):
        encode_value(value)
    with pytest.raises(ConfigurationError, match="cannot fingerprint"):
        encode_payload(value)


def test_a_type_msgspec_cannot_decode_into_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="cannot decode"):
        decode_value(encode_value(1), object())


def test_an_unencodable_response_is_a_configuration_error() -> None:
    bad = StoredResponse(200, (("x-big", 2**70),), b"")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="cannot store a response"):
        encode_response(bad)


def test_the_not_kept_marker_is_no_encoded_value() -> None:
    from idemkey._codec import RESULT_NOT_KEPT

    with pytest.raises(RecordFormatError):
        decode_value(RESULT_NOT_KEPT)


@pytest.mark.parametrize(
    "data", [b"", b"\x00\x90", bytes([FORMAT_VERSION + 2]) + b"\x90", b"\x80\x04pickle"]
)
def test_unknown_formats_are_refused_clearly(data: bytes) -> None:
    with pytest.raises(RecordFormatError, match="format") as exc:
        decode_value(data)
    assert isinstance(exc.value, StoreError)
    with pytest.raises(RecordFormatError):
        decode_response(data)


@pytest.mark.parametrize("data", [bytes([FORMAT_VERSION]), bytes([FORMAT_VERSION]) + b"\xc1"])
def test_truncated_or_corrupt_records_are_record_format_errors(data: bytes) -> None:
    with pytest.raises(RecordFormatError):
        decode_value(data)
    with pytest.raises(RecordFormatError):
        decode_response(data)


def test_payloads_bytes_as_is_text_as_utf8_else_deterministic_msgpack() -> None:
    assert encode_payload(b"\x00raw") == b"\x00raw"
    assert encode_payload("caf\u00e9") == "caf\u00e9".encode()
    # Equal dicts built in another order identify the same work.
    assert encode_payload({"a": 1, "b": [1, 2]}) == encode_payload({"b": [1, 2], "a": 1})
    assert encode_payload({"a": 1}) != encode_payload({"a": 2})


def test_an_unencodable_payload_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="pass bytes"):
        encode_payload(object())
    with pytest.raises(ConfigurationError, match="str keys"):
        encode_payload({1: "a"})


@pytest.mark.parametrize("status", [0, 99, 100, 101, 103, 199, 600, 999, -1])
def test_a_stored_status_outside_200_599_is_a_record_format_error(status: int) -> None:
    # A 1xx is interim (plan_for never stores one): waitress and uvicorn drop the connection
    # on a replay of 101 or 103, on every retry.
    data = b"\x01" + msgspec.msgpack.encode([status, [], b"body", True])
    with pytest.raises(RecordFormatError):
        decode_response(data)
