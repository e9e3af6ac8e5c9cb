"""Numbers read back from Redis are input (idemkey._core._stored): a key under the prefix that
idemkey did not write, or a damaged record, must not fail a listing."""

from __future__ import annotations

import pytest

from idemkey._core._origin import decode_origin
from idemkey._core._stored import stored_int
from idemkey.store.status import decode_status, lease_left_ms
from idemkey.store.uncertain import decode_entry

NAME = b"p:{" + b"0123456789abcdef" * 2 + b"}"
#: Digits str.isdigit passes and int refuses, more digits than int reads, and a number whose
#: thousandth no float holds.
NOT_NUMBERS = ["²".encode(), b"9" * 5000, b"9" * 400]


def test_stored_int_reads_plain_numbers_only() -> None:
    assert stored_int("1765000000000") == 1765000000000
    assert stored_int("9" * 19) == int("9" * 19)
    for raw in ("", "-1", "1.5", " 1", "²", "١٢", "9" * 20):
        assert stored_int(raw) is None


@pytest.mark.parametrize("raw", NOT_NUMBERS)
def test_a_claim_time_that_is_no_number_is_no_time(raw: bytes) -> None:
    origin = decode_origin([raw + b" GET /r\nscope"])
    assert (origin.at, origin.method, origin.route, origin.scope) == (None, "GET", "/r", "scope")


@pytest.mark.parametrize("raw", NOT_NUMBERS)
def test_a_fence_or_deadline_that_is_no_number_is_none(raw: bytes) -> None:
    fields = [b"in_progress", raw, b"owner", None, None, raw, b"fp"]
    status = decode_status(NAME, fields, 1000, lease_left_ms(raw, None, 5))
    assert status is not None
    assert (status.state, status.fence, status.lease_left) == ("lapsed", None, None)


@pytest.mark.parametrize("raw", NOT_NUMBERS)
def test_an_uncertain_entry_with_no_numbers(raw: bytes) -> None:
    entry = decode_entry(raw + b"-0", {b"fence": raw, b"kind": b"complete"})
    assert (entry.at, entry.fence, entry.kind) == (0.0, None, "complete")


def test_an_uncertain_entry_whose_steps_nest_deeper_than_json_reads() -> None:
    entry = decode_entry(b"1-0", {b"steps": b"[" * 100_000})
    assert entry.steps == ("[" * 100_000,)
