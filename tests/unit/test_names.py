"""A record's names (idemkey._core._names): built in one place, parsed in one place (issue 40)."""

from __future__ import annotations

import pickle

import pytest

from idemkey._core import (
    Record,
    RecordName,
    is_digest,
    parse_record_name,
    record_for,
    record_from_digest,
    record_pattern,
)
from idemkey.store.status import FIELDS, NAMED_FIELDS, StatusFields, decode_status, status_fields

DIGEST = "0123456789abcdef" * 2


def test_a_record_from_its_digest_is_the_record_record_for_names() -> None:
    record = record_for("p", "s", "POST", "/r", "k")
    assert record_from_digest("p", record.digest) == record
    assert type(record_from_digest("p", record.digest)) is Record
    assert record.record_key == f"p:{{{record.digest}}}"


def test_the_lock_name_of_0_2_is_built_when_asked() -> None:
    record = record_from_digest("p", DIGEST)
    assert len(record) == 2  # not a field: a request never builds it
    assert record.lock_key == record.lock == f"p:{{{DIGEST}}}:lock"
    assert repr(record) == f"Record(digest='{DIGEST}', record_key='p:{{{DIGEST}}}')"


def test_a_record_built_with_0_3_0s_three_fields_is_the_same_record() -> None:
    name = f"p:{{{DIGEST}}}"
    assert Record(DIGEST, name, name + ":lock") == Record(DIGEST, name) == (DIGEST, name)
    keywords = Record(digest=DIGEST, record_key=name, lock_key=name + ":lock")
    assert keywords.lock_key == name + ":lock"
    with pytest.raises(ValueError, match="lock_key"):
        Record(DIGEST, name, "elsewhere")


def test_a_record_survives_pickle_and_replace() -> None:
    record = record_from_digest("p", DIGEST)
    again = pickle.loads(pickle.dumps(record))
    assert (type(again), again) == (Record, record)
    moved = record._replace(record_key="q:{x}")
    assert type(moved) is Record
    assert moved.lock_key == "q:{x}:lock"


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        (f"p:{{{DIGEST}}}", RecordName("p", DIGEST, "")),
        (f"a:b:{{{DIGEST}}}:lock", RecordName("a:b", DIGEST, ":lock")),
        (f"p:{{{DIGEST}}}:done".encode(), RecordName("p", DIGEST, ":done")),
        (f"p:{{{DIGEST}}}:gone".encode(), RecordName("p", DIGEST, ":gone")),
        (b"\xff:{" + DIGEST.encode() + b"}", RecordName("\\xff", DIGEST, "")),
    ],
)
def test_names_parse_back_to_prefix_digest_and_hint(name: str | bytes, parsed: RecordName) -> None:
    assert parse_record_name(name) == parsed


@pytest.mark.parametrize(
    "name",
    [
        "p:{short}",
        f"p:{{{DIGEST.upper()}}}",
        f"p:{{{DIGEST}}}:other",
        f"p:{{{DIGEST}}}\n",
        f":{{{DIGEST}}}",  # a policy's prefix is never empty
        f"p{{x}}:{{{DIGEST}}}",  # nor holds a brace
        f"{{{DIGEST}}}",
        "p:uncertain",
    ],
)
def test_other_names_are_not_records(name: str) -> None:
    assert parse_record_name(name) is None


def test_every_name_record_for_builds_parses_back() -> None:
    for prefix in ("idemkey", "a:b", "ü", "x*?[]"):
        record = record_for(prefix, "s", "POST", "/r", "k")
        assert parse_record_name(record.record_key) == RecordName(prefix, record.digest, "")
        assert parse_record_name(record.lock_key) == RecordName(prefix, record.digest, ":lock")


def test_the_scan_pattern_escapes_the_prefix() -> None:
    assert record_pattern("a*b?[c]\\") == "a\\*b\\?\\[c\\]\\\\:{*}"


def test_a_digest_is_32_lower_case_hex_digits_and_nothing_more() -> None:
    assert is_digest(DIGEST)
    assert not is_digest(DIGEST + "\n")  # the console's "^...$" let a line break through
    assert not is_digest(DIGEST.upper())
    assert not is_digest(DIGEST[:-1])


def test_status_fields_are_read_by_name() -> None:
    reply = [b"in_progress", b"7", b"owner", b"1", b"2", b"99", b"fp", b"0 GUARD f\n", None]
    fields = status_fields(reply + [None] * (len(FIELDS) - len(reply)))
    assert fields.state == b"in_progress"
    assert (fields.fence, fields.owner, fields.takeover) == (b"7", b"owner", b"1")
    assert (fields.steps, fields.lease, fields.fingerprint) == (b"2", b"99", b"fp")
    assert fields.origin[0] == b"0 GUARD f\n"
    assert len(fields.origin) == len(FIELDS) - len(NAMED_FIELDS)
    assert status_fields(reply[: len(NAMED_FIELDS)]).origin == ()  # idemkey stats' read
    assert len(NAMED_FIELDS) == len(StatusFields._fields) - 1  # every name but the origin
    status = decode_status(f"p:{{{DIGEST}}}", fields, 5000, 1000, now=1.0)
    assert status is not None
    assert (status.state, status.fence, status.owner, status.takeover) == (
        "in_progress",
        7,
        "owner",
        True,
    )
    assert (status.digest, status.method, status.route) == (DIGEST, "GUARD", "f")


def test_a_hash_whose_name_is_not_a_records_has_no_status() -> None:
    fields = status_fields([None, None, None, None, None, None, b"fp"])
    assert decode_status(f"p:{{{DIGEST}}}", fields, 5000, -2) is not None
    assert decode_status("p:{not-a-digest}", fields, 5000, -2) is None


@pytest.mark.parametrize("prefix", ["idemkey", "billing:eu", "p" * 500, "x:"])
def test_a_record_names_its_prefix_back(prefix: str) -> None:
    """``record_prefix`` reads the prefix a record's name was built with (the uncertain
    stream's and the effects row's), whatever colons it holds."""
    from idemkey._core._names import record_prefix

    record = record_for(prefix, "s", "POST", "/r", "k")
    assert record_prefix(record.record_key) == prefix
    assert record_prefix(record_from_digest(prefix, DIGEST).record_key) == prefix
