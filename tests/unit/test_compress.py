"""Policy(compress=...): format 2 records (zlib-compressed MessagePack) and how they are read.

A record is read by its format byte whatever the reader's policy says, so records written
before compression was turned on (or off) still replay. A damaged or forged compressed record is
a RecordFormatError, never a raw zlib.error, and never inflates past MAX_INFLATED_BYTES.
"""

from __future__ import annotations

import os
import zlib

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import idemkey._codec as codec
from idemkey import ConfigurationError, Policy, RecordFormatError, StoredResponse
from idemkey._codec import COMPRESSED_FORMAT, FORMAT_VERSION, MAX_INFLATED_BYTES
from idemkey.policy import DEFAULT_COMPRESS_AT
from idemkey.records import decode_response, decode_value, encode_response, encode_value

JSON = b'{"id":"ord_1","amount":4200,"currency":"eur","status":"paid"}' * 40
RESPONSE = StoredResponse(201, (("content-type", "application/json"),), JSON, reason="Created")


def encoded_size(response: StoredResponse) -> int:
    return len(encode_response(response)) - 1  # the MessagePack, without the format byte


def test_a_large_json_response_is_stored_compressed_and_decodes_to_the_same_response() -> None:
    data = encode_response(RESPONSE, 0)
    assert data[0] == COMPRESSED_FORMAT
    assert len(data) < len(JSON) / 5
    assert decode_response(data) == RESPONSE


@given(st.integers(200, 599), st.binary(), st.booleans(), st.integers(0, 4096))
def test_responses_round_trip_whatever_the_threshold(
    status: int, body: bytes, kept: bool, compress_at: int
) -> None:
    response = StoredResponse(status, (("x-a", "1"),), body, kept)
    assert decode_response(encode_response(response, compress_at)) == response


@given(
    st.lists(
        st.text(max_size=30) | st.integers(-(2**63), 2**63 - 1) | st.binary(max_size=40),
        max_size=60,
    )
)
def test_guard_values_round_trip_compressed(value: list[object]) -> None:
    assert decode_value(encode_value(value, 0)) == value


def test_the_threshold_is_the_encoded_record_size_at_or_above_which_it_compresses() -> None:
    size = encoded_size(RESPONSE)
    assert encode_response(RESPONSE, size)[0] == COMPRESSED_FORMAT
    assert encode_response(RESPONSE, size + 1)[0] == FORMAT_VERSION
    assert encode_response(RESPONSE, None)[0] == FORMAT_VERSION
    assert encode_response(RESPONSE)[0] == FORMAT_VERSION  # off unless asked for
    value = ["receipt"] * 200
    value_size = len(encode_value(value)) - 1
    assert encode_value(value, value_size)[0] == COMPRESSED_FORMAT
    assert encode_value(value, value_size + 1)[0] == FORMAT_VERSION


def test_a_record_compression_would_not_shrink_is_stored_as_it_is() -> None:
    noise = StoredResponse(200, (), os.urandom(4096))
    assert encode_response(noise, 0) == encode_response(noise)
    assert encode_value(os.urandom(4096), 0)[0] == FORMAT_VERSION
    assert encode_value("x", 0)[0] == FORMAT_VERSION  # a tiny record grows under zlib


@pytest.mark.parametrize("encoding", ["gzip", "br", " GZIP "])
def test_a_body_the_app_already_encoded_is_not_compressed_again(encoding: str) -> None:
    gzipped = StoredResponse(200, (("Content-Encoding", encoding),), JSON)
    assert encode_response(gzipped, 0)[0] == FORMAT_VERSION
    identity = StoredResponse(200, (("content-encoding", "identity"),), JSON)
    assert encode_response(identity, 0)[0] == COMPRESSED_FORMAT


def test_records_written_before_compression_existed_still_decode() -> None:
    # Format 1 bytes exactly as the release before compression wrote them.
    old_response = b"\x01\x94\xcc\xc9\x91\x92\xa1a\xa11\xc4\x02hi\xc3"
    assert old_response == b"\x01" + msgspec.msgpack.encode([201, [["a", "1"]], b"hi", True])
    assert decode_response(old_response) == StoredResponse(201, (("a", "1"),), b"hi")
    assert decode_value(b"\x01\x92\xa2ok\x2a") == ["ok", 42]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda d: d[:1] + b"not zlib at all", id="not-zlib"),
        pytest.param(lambda d: d[:-5], id="truncated"),
        pytest.param(lambda d: d[:1], id="format-byte-only"),
        pytest.param(lambda d: d + b"tail", id="trailing-bytes"),
        pytest.param(lambda d: d[:-1] + bytes([d[-1] ^ 0xFF]), id="bad-checksum"),
        pytest.param(lambda d: d[:20] + bytes([d[20] ^ 0x55]) + d[21:], id="flipped-byte"),
    ],
)
def test_a_damaged_compressed_record_is_a_record_format_error(damage: object) -> None:
    assert callable(damage)
    for data in (encode_response(RESPONSE, 0), encode_value(JSON.decode(), 0)):
        assert data[0] == COMPRESSED_FORMAT
        with pytest.raises(RecordFormatError):
            decode_response(damage(data))
        with pytest.raises(RecordFormatError):
            decode_value(damage(data))


def test_compressed_bytes_that_are_not_a_record_are_a_record_format_error() -> None:
    data = bytes([COMPRESSED_FORMAT]) + zlib.compress(b"\xc1" * 100)
    with pytest.raises(RecordFormatError, match="unreadable"):
        decode_response(data)
    with pytest.raises(RecordFormatError, match="unreadable"):
        decode_value(data)


def test_a_decompression_bomb_is_refused_at_the_cap() -> None:
    bomb = bytes([COMPRESSED_FORMAT]) + zlib.compress(b"\x00" * (MAX_INFLATED_BYTES + 1), 9)
    assert len(bomb) < 20_000
    with pytest.raises(RecordFormatError, match="inflates past"):
        decode_value(bomb)
    with pytest.raises(RecordFormatError, match="inflates past"):
        decode_response(bomb)


def test_a_record_of_exactly_the_cap_is_compressed_and_read_one_byte_more_is_not_compressed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(codec, "MAX_INFLATED_BYTES", 4096)
    at_cap = b"\x00" * (4096 - 3)  # bin 16: two length bytes and a type byte
    data = encode_value(at_cap, 0)
    assert data[0] == COMPRESSED_FORMAT
    assert decode_value(data) == at_cap
    over = encode_value(at_cap + b"\x00", 0)
    assert over[0] == FORMAT_VERSION  # the writer never writes what the reader would refuse
    assert decode_value(over) == at_cap + b"\x00"


@pytest.mark.parametrize(
    ("compress", "compress_at"),
    [(None, None), (False, None), (True, DEFAULT_COMPRESS_AT), (0, 0), (4096, 4096)],
)
def test_policy_compress_takes_a_switch_or_a_size(compress: object, compress_at: object) -> None:
    policy = Policy(compress=compress)  # type: ignore[arg-type]
    assert policy.compress_at == compress_at
    assert Policy().compress_at is None
    assert policy.replace(compress=None).compress_at is None


def test_policies_that_compress_alike_are_equal() -> None:
    assert Policy(compress=True) == Policy(compress=DEFAULT_COMPRESS_AT)
    assert hash(Policy(compress=True)) == hash(Policy(compress=DEFAULT_COMPRESS_AT))
    assert Policy(compress=False) == Policy(compress=None) == Policy()
    assert Policy(compress=True) != Policy(compress=0) != Policy()


@pytest.mark.parametrize("compress", [-1, 1.5, "yes", "1024", b"1"])
def test_policy_compress_refuses_anything_else(compress: object) -> None:
    with pytest.raises(ConfigurationError, match=r"Policy\(compress=\.\.\.\): expected"):
        Policy(compress=compress)  # type: ignore[arg-type]
