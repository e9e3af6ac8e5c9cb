"""The sans-IO decisions: script replies, fingerprints, retry hints, polling, policy."""

from __future__ import annotations

import os
import warnings

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from idemkey import ConfigurationError, Policy, RecordFormatError, StoreError
from idemkey._core import (
    decode_claim_reply,
    fingerprint,
    next_poll_delay,
    owner_tag,
    retry_after_seconds,
)
from idemkey.records import (
    Claimed,
    InFlight,
    Mismatch,
    Record,
    Replay,
    new_owner,
    payload_fingerprint,
    record_for,
)
from idemkey.store._leases import LeaseTable


@pytest.mark.parametrize(
    ("reply", "decision"),
    [
        ([1, 1, 0], Claimed("o", 1, False)),
        ([1, 7, 1], Claimed("o", 7, True)),
        ([2, b"\x01\x90"], Replay(b"\x01\x90")),
        ([3, 1500], InFlight(1.5)),
        ([3, -1], InFlight(0.0)),  # PTTL -1/-2 (lock vanished meanwhile) is "retry now"
        ([4], Mismatch()),
    ],
)
def test_claim_replies_decode_into_decisions(reply: object, decision: object) -> None:
    decoded = decode_claim_reply(reply, "o")
    # Built with tuple.__new__ on the hot path: the same type and fields as the constructor's.
    assert type(decoded) is type(decision)
    assert decoded == decision
    assert repr(decoded) == repr(decision)


@pytest.mark.parametrize("kind", [b"string", b"list", b"ReJSON-RL"])
def test_a_key_of_another_type_is_an_unreadable_record_not_a_store_failure(kind: bytes) -> None:
    # claim.lua's answer when the record's name holds no hash: Redis answered (the guards and
    # adapters never run beside it, whatever on_store_error says).
    with pytest.raises(RecordFormatError, match=f"^not an idemkey record: a {kind.decode()}$"):
        decode_claim_reply([6, kind], "o")


def test_record_for_builds_a_record_as_its_constructor_does() -> None:
    record = record_for("p", "s", "POST", "/r", "k")
    assert type(record) is Record
    assert record == Record(record.digest, f"p:{{{record.digest}}}", f"p:{{{record.digest}}}:lock")
    assert (record.key, record.lock) == (f"p:{{{record.digest}}}", f"p:{{{record.digest}}}:lock")


@pytest.mark.parametrize(
    "reply",
    [None, [], b"OK", [9], [2], [2, "text"], [1, 1], [3], "claimed", [[1, 1, 0]], [6], [6, 1]],
)
def test_unexpected_replies_are_store_errors(reply: object) -> None:
    with pytest.raises(StoreError, match="unexpected reply"):
        decode_claim_reply(reply, "o")


def test_fingerprints_separate_every_part_and_ignore_query_order() -> None:
    base = fingerprint("POST", "/charges/1", "a=1&b=2", "application/json", b"{}")
    assert base == fingerprint("POST", "/charges/1", "b=2&a=1", "application/json", b"{}")
    variants = [
        fingerprint("PATCH", "/charges/1", "a=1&b=2", "application/json", b"{}"),
        fingerprint("POST", "/charges/2", "a=1&b=2", "application/json", b"{}"),
        fingerprint("POST", "/charges/1", "a=1&b=3", "application/json", b"{}"),
        fingerprint("POST", "/charges/1", "a=1&b=2", "text/plain", b"{}"),
        fingerprint("POST", "/charges/1", "a=1&b=2", "application/json", b"{ }"),
        # length prefixes: moving a byte between fields changes the fingerprint
        fingerprint("POST", "/charges/1a", "=1&b=2", "application/json", b"{}"),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_a_repeated_query_name_keeps_its_values_in_order() -> None:
    # The app reads ?sort=price&sort=date as a list (werkzeug's getlist, Django's QueryDict):
    # the same values in another order are another request, so another key's 422, never a
    # replay of the first.
    def fp(query: str) -> bytes:
        return fingerprint("POST", "/orders", query, "application/json", b"{}")

    assert fp("sort=price&sort=date") != fp("sort=date&sort=price")
    assert fp("a=1&sort=price&sort=date") == fp("sort=price&a=1&sort=date")
    assert fp("amount=1&amount=100&b=2") != fp("b=2&amount=100&amount=1")
    # One name however it is spelled, as the app decodes it: still a list in order.
    assert fp("%73ort=date&sort=price") != fp("sort=price&%73ort=date")
    assert fp("a+b=1&a%20b=2") != fp("a%20b=2&a+b=1")
    assert fp("ids[]=1&ids%5B%5D=2") != fp("ids%5B%5D=2&ids[]=1")
    assert fp("a&a=1") != fp("a=1&a")
    # A raw UTF-8 name as a WSGI server hands it over (latin-1 text) is its %-escaped twin.
    raw = "é".encode().decode("latin-1")
    assert fp(f"{raw}=1&%C3%A9=2") != fp(f"%C3%A9=2&{raw}=1")


@given(
    st.lists(st.text(alphabet="ab-_.2", min_size=1, max_size=4), max_size=6, unique=True),
    st.lists(st.text(alphabet="ab=%+2-", max_size=4), min_size=6, max_size=6),
)
def test_distinct_query_names_fingerprint_as_earlier_versions_stored_them(
    names: list[str], values: list[str]
) -> None:
    # Records written before repeated names kept their order held the whole pairs sorted:
    # a retry across the upgrade must still match them when every name is distinct and plain
    # (no "%" or "+" to decode) and carries a value.
    query = "&".join(f"{name}={value}" for name, value in zip(names, values, strict=False))
    old = "&".join(sorted(query.split("&"))) if "&" in query else query
    assert fingerprint("POST", "/p", query, "", b"") == fingerprint("POST", "/p", old, "", b"")


@given(st.text(), st.text(), st.text(), st.binary())
def test_fingerprints_never_fail_on_client_input(
    target: str, query: str, content_type: str, body: bytes
) -> None:
    fp = fingerprint("POST", target, query, content_type, body)
    assert len(fp) == 16  # raw bytes: what the record stores


def test_payload_fingerprints_tell_payloads_apart() -> None:
    assert payload_fingerprint(b"a") == payload_fingerprint(b"a")
    assert payload_fingerprint(b"a") != payload_fingerprint(b"b")


def test_fingerprints_are_xxh3_128_as_16_raw_bytes() -> None:
    # The hex form is what idemkey stored before 0.2; claim.lua compares the two forms.
    assert payload_fingerprint(b"a").hex() == xxhash.xxh3_128_hexdigest(b"a")


def test_an_owner_tag_is_the_first_12_digits_or_a_hash_of_a_custom_owner() -> None:
    owner = new_owner()
    assert owner_tag(owner) == owner[:12]
    tags = {owner_tag(f"worker-1:{i}") for i in range(1000)}  # a shared prefix
    assert len(tags) == 1000
    assert all(len(tag) == 12 for tag in tags)


def test_owners_are_fresh_and_unguessable() -> None:
    owners = {new_owner() for _ in range(1000)}
    assert len(owners) == 1000
    assert all(len(owner) == 32 and int(owner, 16) >= 0 for owner in owners)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_hands_out_its_parents_owner_tokens() -> None:
    # Owner tokens are read from os.urandom in blocks: a child that inherited the unused
    # rest of a block would share tokens with its parent, and both would own one record.
    new_owner()  # a block is read and partly used
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # forking with threads running
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, "".join(new_owner() for _ in range(8)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child = pipe.read().decode()
    os.waitpid(pid, 0)
    theirs = {child[i : i + 32] for i in range(0, len(child), 32)}
    ours = {new_owner() for _ in range(8)}
    assert len(theirs) == 8
    assert not theirs & ours


@pytest.mark.parametrize(
    ("seconds", "header"), [(0.0, 1), (0.001, 1), (1.0, 1), (1.2, 2), (29.999, 30), (30.0, 30)]
)
def test_retry_after_rounds_up_to_whole_seconds(seconds: float, header: int) -> None:
    assert retry_after_seconds(seconds) == header


def test_polling_backs_off_and_never_overruns_the_wait() -> None:
    delays, delay, remaining = [], 0.0, 10.0
    for _ in range(10):
        delay = next_poll_delay(delay, remaining)
        delays.append(delay)
    assert delays[:3] == [0.005, 0.01, 0.02]
    assert max(delays) == 0.25
    assert next_poll_delay(0.2, 0.03) == 0.03
    assert next_poll_delay(0.2, -1.0) == 0.0


def test_lease_table_renews_every_third_of_a_lease() -> None:
    table = LeaseTable()
    record = record_for("p", "", "GUARD", "", "k")
    table.add(record, "o", 3000, now=100.0)
    assert table.next_due() == 101.0
    assert table.due(100.5) == []
    (lease,) = table.due(101.0)
    table.renewed(lease, 101.0)
    assert table.next_due() == 102.0
    table.failed(lease, 102.0)
    assert table.next_due() == pytest.approx(102.3)  # a failed renewal retries soon
    table.remove(record, "o")
    assert not table.holds(lease)
    assert len(table) == 0


def test_lease_table_takes_each_renewal_answer() -> None:
    table = LeaseTable()
    record = record_for("p", "", "GUARD", "", "k")
    table.add(record, "o", 3000, now=100.0)
    (lease,) = table.due(101.0)
    assert table.answered(lease, True, 101.0) is False  # renewed: due a third later
    assert table.next_due() == 102.0
    assert table.answered(lease, None, 102.0) is False  # failed: due again soon
    assert table.next_due() == pytest.approx(102.3)
    assert table.answered(lease, False, 102.3) is True  # taken over: lost, no longer renewed
    assert len(table) == 0
    table.add(record, "o", 3000, now=200.0)
    (live,) = table.due(201.0)
    table.remove(record, "o")  # completed while its renewal was on the way
    assert table.answered(live, False, 201.0) is False
    assert len(table) == 0


def test_policy_defaults() -> None:
    policy = Policy()
    assert (policy.ttl, policy.lease, policy.wait) == (86_400.0, 30.0, 0.0)
    assert (policy.ttl_ms, policy.lease_ms) == (86_400_000, 30_000)
    assert policy.methods == frozenset({"POST", "PATCH"})


@pytest.mark.parametrize(
    "changes",
    [
        {"lease": 0},
        {"lease": 10, "ttl": 5},
        {"wait": -1},
        {"prefix": ""},
        {"prefix": "a{b"},
        {"on_store_error": "maybe"},
        {"mismatch_status": 500},
        {"max_request_bytes": -1},
        {"header": ""},
    ],
)
def test_policy_refuses_values_that_cannot_work(changes: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        Policy(**changes)  # type: ignore[arg-type]


def test_policy_is_frozen_and_replace_validates() -> None:
    policy = Policy(methods=frozenset({"post"}), header_denylist=frozenset({"X-Secret"}))
    assert policy.methods == frozenset({"POST"})
    assert "x-secret" in policy.header_denylist
    with pytest.raises(AttributeError):
        policy.wait = 1.0  # type: ignore[misc]
    assert policy.replace(wait=2.0).wait == 2.0
    with pytest.raises(ConfigurationError):
        policy.replace(lease=0)
