"""inspect, forget and stats against the real session server, through ``main([...])``."""

from __future__ import annotations

import contextlib
import io
import json
import sys

import pytest
import redis

from idemkey import Policy, RedisStore, guard
from idemkey._codec import StoredResponse, encode_response, encode_value
from idemkey._core import record_for, record_pattern
from idemkey.cli import _progress as progress
from idemkey.guard import GUARD_METHOD
from tests._lease import lapse, lease_holder
from tests.cli.conftest import CliRunner, http_record


def _at(url: str, prefix: str) -> tuple[str, ...]:
    return ("--redis-url", url, "--prefix", prefix)


# ---- inspect ------------------------------------------------------------------------------


def test_inspect_shows_a_completed_http_record(
    idemkey: CliRunner, store: RedisStore, redis_url: str, prefix: str
) -> None:
    record = http_record(store, "order-42", scope="acct_1")
    run = idemkey(
        "inspect", "order-42", "--scope", "acct_1", "--route", "/charges", *_at(redis_url, prefix)
    )
    assert run.code == 0, run.err
    assert run.err == ""
    lines = dict(line.split(None, 1) for line in run.out.splitlines() if not line.startswith(" "))
    assert lines["record"] == record.key
    assert lines["state"] == "complete"
    assert lines["fence"] == "-"  # a completed record keeps no fence counter
    assert lines["owner"].endswith("...")  # the owner's 12-digit tag, kept to answer its re-send
    assert lines["lease"].startswith("none")
    assert lines["ttl"].startswith("23h 59m")  # the default 24 h retention, just started
    assert lines["status"] == "201"
    assert lines["body"] == "27 bytes"
    assert lines["preview"] == '{"id":"ch_1","amount":1000}'
    assert "  Location: /charges/ch_1" in run.out.splitlines()


def test_inspect_json_and_by_digest_agree(
    idemkey: CliRunner, store: RedisStore, redis_url: str, prefix: str
) -> None:
    record = http_record(store, "order-7", scope="acct_1", status=402, body=b"\xff\x00declined")
    by_key = idemkey(
        "inspect", "order-7", "--scope", "acct_1", "--route", "/charges", "--json",
        *_at(redis_url, prefix),
    )  # fmt: skip
    by_digest = idemkey("--json", "inspect", "--digest", record.digest, *_at(redis_url, prefix))
    assert by_key.code == by_digest.code == 0
    view, same = json.loads(by_key.out), json.loads(by_digest.out)
    assert 0 <= view.pop("ttl_ms") - same.pop("ttl_ms") < 60_000  # read a moment apart
    assert same == view
    assert view["state"] == "complete"
    assert view["kind"] == "response"
    assert view["status"] == 402
    assert view["body_size"] == 10
    assert view["preview"] == "\\xff\\x00declined"  # bytes that are not UTF-8 come out escaped
    assert view["headers"] == [["Content-Type", "application/json"], ["Location", "/charges/ch_1"]]


def test_inspect_takes_the_header_value_as_sent(
    idemkey: CliRunner, store: RedisStore, redis_url: str, prefix: str
) -> None:
    record = http_record(store, "order-42", scope="acct_1")
    at = ("--scope", "acct_1", "--route", "/charges", "--json", *_at(redis_url, prefix))
    quoted = idemkey("inspect", '"order-42"', *at)  # the RFC 8941 form names the same record
    assert quoted.code == 0
    assert json.loads(quoted.out)["record"] == record.key
    invalid = idemkey("inspect", "order 42", *at)
    assert invalid.code == 2
    assert json.loads(invalid.err)["error"].startswith("not a valid Idempotency-Key")  # --json


def test_inspect_other_scope_or_route_is_another_record(
    idemkey: CliRunner, store: RedisStore, redis_url: str, prefix: str
) -> None:
    http_record(store, "order-42", scope="acct_1")
    other_scope = idemkey(
        "inspect", "order-42", "--scope", "acct_2", "--route", "/charges", *_at(redis_url, prefix)
    )
    other_route = idemkey(
        "inspect", "order-42", "--scope", "acct_1", "--route", "/refunds", *_at(redis_url, prefix)
    )
    assert other_scope.code == other_route.code == 1
    assert other_scope.out.startswith("no record ")


def test_inspect_in_progress_shows_the_lease_and_owner(
    idemkey: CliRunner, store: RedisStore, redis_url: str, prefix: str
) -> None:
    record = http_record(store, "order-9", complete=False)
    run = idemkey("inspect", "--digest", record.digest, "--json", *_at(redis_url, prefix))
    view = json.loads(run.out)
    assert view["state"] == "in_progress"
    assert 0 < view["lease_ms"] <= 30_000
    assert view["kind"] == ""
    text = idemkey("inspect", "--digest", record.digest, *_at(redis_url, prefix)).out
    owner = next(line for line in text.splitlines() if line.startswith("owner"))
    assert owner.endswith("...")
    assert len(owner.split()[1]) == 11


def test_inspect_guard_records_decode_the_stored_value(
    idemkey: CliRunner, store: RedisStore, redis_url: str, prefix: str
) -> None:
    with guard(store, "invoice-1", payload=b"x") as call:
        call.save({"charge": "ch_9", "amount": 500})
    with guard(store, "invoice-2") as call:
        pass  # left without save(): released, only the fence stays
    run = idemkey("inspect", "invoice-1", "--guard", "--json", *_at(redis_url, prefix))
    view = json.loads(run.out)
    assert (view["state"], view["kind"]) == ("complete", "result")
    assert view["preview"] == "{'charge': 'ch_9', 'amount': 500}"
    released = json.loads(
        idemkey("inspect", "invoice-2", "--guard", "--json", *_at(redis_url, prefix)).out
    )
    assert (released["state"], released["fence"], released["kind"]) == ("released", call.fence, "")


def test_inspect_by_digest_reads_guard_values_too(
    idemkey: CliRunner, store: RedisStore, redis_url: str, prefix: str
) -> None:
    with guard(store, "job-1") as call:
        call.save([1, 2, 3])
    digest = record_for(prefix, "", GUARD_METHOD, "", "job-1").digest
    view = json.loads(idemkey("inspect", "--digest", digest, "--json", *_at(redis_url, prefix)).out)
    assert (view["kind"], view["preview"]) == ("result", "[1, 2, 3]")


def test_inspect_names_what_is_missing(idemkey: CliRunner, redis_url: str) -> None:
    no_key = idemkey("inspect", "--route", "/x", "--redis-url", redis_url)
    bad_digest = idemkey("inspect", "--digest", "xyz", "--redis-url", redis_url)
    for run in (no_key, bad_digest):
        assert run.code == 2
        assert run.out == ""
        assert len(run.err.splitlines()) == 1


# ---- forget -------------------------------------------------------------------------------


def test_forget_deletes_the_record(
    idemkey: CliRunner, store: RedisStore, real_client: redis.Redis, redis_url: str, prefix: str
) -> None:
    record = http_record(store, "order-1")
    run = idemkey(
        "forget",
        "order-1",
        "--scope",
        "acct_1",
        "--route",
        "/charges",
        "--yes",
        *_at(redis_url, prefix),
    )
    assert run.code == 0, run.err
    assert run.out == f"forgot complete record {record.key} (1 keys deleted)\n"
    assert real_client.exists(record.key) == 0
    # The key is free again: the same request now runs afresh.
    assert type(store.claim(record, "fp-order-1", heartbeat=False)).__name__ == "Claimed"


def test_forget_refuses_an_in_progress_record_without_force(
    idemkey: CliRunner, store: RedisStore, real_client: redis.Redis, redis_url: str, prefix: str
) -> None:
    record = http_record(store, "order-2", complete=False)
    before = real_client.hgetall(record.key)
    refused = idemkey("forget", "--digest", record.digest, "--yes", *_at(redis_url, prefix))
    assert refused.code == 1
    assert "in-progress" in refused.err
    assert "--force" in refused.err
    assert len(refused.err.splitlines()) == 1
    assert real_client.hgetall(record.key) == before  # untouched, its live lease too
    assert lease_holder(real_client, record) is not None
    forced = idemkey(
        "forget", "--digest", record.digest, "--yes", "--force", "--json", *_at(redis_url, prefix)
    )
    assert forced.code == 0
    # One key: the record, its lease a field of it.
    assert json.loads(forced.out) == {"record": record.key, "deleted": 1, "state": "in_progress"}
    assert real_client.exists(record.key) == 0


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("answer", "deleted"), [("y\n", True), ("n\n", False), ("\n", False)])
def test_forget_asks_on_a_terminal(
    idemkey: CliRunner,
    store: RedisStore,
    real_client: redis.Redis,
    redis_url: str,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    answer: str,
    deleted: bool,
) -> None:
    record = http_record(store, "order-3")
    monkeypatch.setattr(sys, "stdin", _Terminal(answer))
    run = idemkey("forget", "--digest", record.digest, *_at(redis_url, prefix))
    assert f"forget complete record {record.key}? [y/N]" in run.err
    assert run.code == (0 if deleted else 1)
    assert real_client.exists(record.key) == (0 if deleted else 1)


def test_forget_yes_skips_the_question(
    idemkey: CliRunner,
    store: RedisStore,
    real_client: redis.Redis,
    redis_url: str,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    record = http_record(store, "order-4")
    monkeypatch.setattr(sys, "stdin", _Terminal(""))
    run = idemkey("forget", "--digest", record.digest, "-y", *_at(redis_url, prefix))
    assert run.code == 0
    assert "[y/N]" not in run.err
    assert real_client.exists(record.key) == 0


def test_forget_a_missing_record(idemkey: CliRunner, redis_url: str, prefix: str) -> None:
    run = idemkey("forget", "nope", "--guard", "--yes", *_at(redis_url, prefix))
    assert run.code == 1
    assert run.err.startswith("idemkey forget: no record ")


@pytest.mark.parametrize("kind", ["string", "list"])
def test_a_key_of_another_type_is_shown_as_such_and_forget_removes_it(
    idemkey: CliRunner, real_client: redis.Redis, redis_url: str, prefix: str, kind: str
) -> None:
    """A key that is no hash where a record should be (a stranger's SET, damage) makes every
    request with that key 503 record_unreadable: inspect says what it is, not "Redis failed"
    (exit 3), and forget, the remedy, deletes it, by key and by digest."""
    for key in ("other-1", "other-2"):
        name = record_for(prefix, "", GUARD_METHOD, "", key).key
        real_client.set(name, "not a hash") if kind == "string" else real_client.rpush(name, "a")
    record = record_for(prefix, "", GUARD_METHOD, "", "other-1")

    shown = idemkey("inspect", "--digest", record.digest, *_at(redis_url, prefix))
    assert shown.code == 0, shown.err
    lines = dict(line.split(None, 1) for line in shown.out.splitlines())
    assert lines["record"] == record.key
    assert lines["state"] == f"not an idemkey record (a {kind})"
    as_json = idemkey("--json", "inspect", "other-1", "--guard", *_at(redis_url, prefix))
    assert as_json.code == 0, as_json.err
    view = json.loads(as_json.out)
    assert (view["exists"], view["state"]) == (True, "foreign")
    assert view["error"] == f"not an idemkey record (a {kind})"

    cancel = idemkey("cancel", "other-1", "--guard", "--yes", *_at(redis_url, prefix))
    assert cancel.code == 1, cancel.err  # one line, not exit 3 ("Redis failed": WRONGTYPE)
    assert "is not an idemkey record: nothing to cancel (forget deletes it)" in cancel.err
    assert real_client.exists(record.key) == 1

    forgot = idemkey("forget", "other-1", "--guard", "--yes", *_at(redis_url, prefix))
    assert forgot.code == 0, forgot.err
    assert forgot.out == f"forgot foreign record {record.key} (1 keys deleted)\n"
    assert real_client.exists(record.key) == 0
    other = record_for(prefix, "", GUARD_METHOD, "", "other-2")
    forgot = idemkey("forget", "--digest", other.digest, "--yes", *_at(redis_url, prefix))
    assert forgot.code == 0, forgot.err
    assert real_client.exists(other.key) == 0


# ---- stats --------------------------------------------------------------------------------


def test_stats_counts_records_made_through_guard(
    idemkey: CliRunner, store: RedisStore, redis_url: str, prefix: str, real_client: redis.Redis
) -> None:
    for i in range(7):
        with guard(store, f"job-{i}", payload=i) as call:
            call.save({"done": i})
    for i in range(2):
        with guard(store, f"skipped-{i}"):
            pass  # released
    running = record_for(prefix, "", GUARD_METHOD, "", "running")
    store.claim(running, "fp", heartbeat=False)
    crashed = record_for(prefix, "", GUARD_METHOD, "", "crashed")
    store.claim(crashed, "fp", heartbeat=False)
    assert lapse(real_client, crashed) == 1  # its owner died and the lease lapsed
    # Someone else's records under another prefix are not counted.
    other = RedisStore(real_client, Policy(prefix=prefix + "x"))
    with guard(other, "job-0") as call:
        call.save(1)

    run = idemkey("stats", "--json", *_at(redis_url, prefix))
    assert run.code == 0, run.err
    stats = json.loads(run.out)
    assert stats["states"] == {"complete": 7, "in_progress": 2, "released": 2, "other": 0}
    assert stats["records"] == 11
    assert stats["in_progress_lease_lapsed"] == 1
    assert sum(stats["ttl"].values()) == 11
    assert stats["ttl"]["6 h - 24 h"] == 11  # every record has the 24 h default retention
    memory = stats["memory"]
    assert memory["sampled"] == 11
    assert 50 < memory["mean_bytes"] < 2000
    assert memory["total_bytes_estimate"] == round(memory["mean_bytes"] * 11)
    real_client.delete(*(k for k in real_client.scan_iter(match=f"{prefix}x:*", count=1000)))

    text = idemkey("stats", *_at(redis_url, prefix))
    assert text.code == 0
    assert "  complete             7\n" in text.out
    assert "(1 with a lapsed lease: crashed owners)" in text.out


def test_stats_reports_progress_on_large_keyspaces(
    idemkey: CliRunner,
    store: RedisStore,
    redis_url: str,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for i in range(30):
        http_record(store, f"order-{i}")
    monkeypatch.setattr(progress, "THRESHOLD", 1)
    monkeypatch.setattr(progress, "EVERY", 1)
    run = idemkey("stats", "--json", "--sample", "5", *_at(redis_url, prefix))
    assert run.code == 0
    assert "idemkey stats: scanned" in run.err
    stats = json.loads(run.out)  # progress never mixes into stdout
    assert stats["records"] == 30
    assert stats["memory"]["sampled"] == 5
    quiet = idemkey("stats", "--json", "--no-progress", *_at(redis_url, prefix))
    assert quiet.err == ""


def test_stats_escapes_glob_characters_in_the_prefix() -> None:
    assert record_pattern("a*b?[c]\\") == "a\\*b\\?\\[c\\]\\\\:{*}"


def test_inspect_stats_and_forget_read_records_written_by_0_1(
    idemkey: CliRunner, store: RedisStore, redis_url: str, prefix: str, real_client: redis.Redis
) -> None:
    # The 0.1 layout, field by field: a completed record kept every claim field and the time.
    old = record_for(prefix, "", GUARD_METHOD, "", "old-job")
    real_client.hset(old.key, mapping={
        "state": "complete", "fp": "ab" * 16, "owner": "3fd5074d" * 4, "fence": 2, "tk": 1,
        "at": 1764494336796, "resp": encode_value({"done": 1}),
    })  # fmt: skip
    real_client.pexpire(old.key, 60_000)
    with guard(store, "new-job") as call:
        call.save({"done": 2})

    at = ("--guard", "--json", *_at(redis_url, prefix))
    view = json.loads(idemkey("inspect", "old-job", *at).out)
    assert (view["state"], view["fence"], view["owner"]) == ("complete", 2, "3fd5074d" * 4)
    assert view["at"] == "2025-11-30T09:18:56.796Z"
    assert view["preview"] == "{'done': 1}"
    new = json.loads(idemkey("inspect", "new-job", *at).out)
    assert (new["state"], new["fence"], new["at"], new["preview"]) == (
        "complete", None, "", "{'done': 2}"
    )  # fmt: skip
    assert len(new["owner"]) == 12  # the owner tag a completed record keeps

    stats = json.loads(idemkey("stats", "--json", *_at(redis_url, prefix)).out)
    assert stats["states"] == {"complete": 2, "in_progress": 0, "released": 0, "other": 0}
    for key in ("old-job", "new-job"):
        forgot = idemkey("forget", key, "--yes", *at)
        assert json.loads(forgot.out)["state"] == "complete"


@pytest.mark.parametrize("number", ["\u00b2", "9" * 19, "9" * 5000, "-1"])
def test_inspect_reads_stored_numbers_as_data(
    idemkey: CliRunner, redis_url: str, prefix: str, number: str
) -> None:
    """A fence or claim time that is no number a record holds (written with raw redis-py) is
    shown as unknown: inspect answers, it does not fail on a stored value."""
    record = record_for(prefix, "", "GUARD", "", "odd")
    client = redis.Redis.from_url(redis_url)
    try:
        client.hset(record.record_key, mapping={"state": "in_progress", "fence": number,
                                                 "at": number, "owner": "o" * 32})  # fmt: skip
    finally:
        client.close()
    run = idemkey("inspect", "--digest", record.digest, "--json", *_at(redis_url, prefix))
    assert run.code == 0, run.err
    view = json.loads(run.out)
    assert view["fence"] == (int(number) if number == "9" * 19 else None)


# ---- stored text and values are input -----------------------------------------------------

#: What a customer may type into a field an error message quotes: a screen clear, red text, a
#: carriage return and a line break that would forge a row of inspect's own.
HOSTILE = "4242\x1b[2J\x1b[31mFAKE\rforged line\nreleased  OK\x07"


class CardDeclined(Exception):
    pass


def test_inspect_prints_stored_text_escaped(
    idemkey: CliRunner, store: RedisStore, real_client: redis.Redis, redis_url: str, prefix: str
) -> None:
    """A remembered failure's message, a response's headers, an owner and step names are
    stored text (any writer's): inspect prints them escaped, as it prints previews, so nothing
    clears the screen, colours it or forges a row."""
    with (
        contextlib.suppress(CardDeclined),
        guard(store, "order-2", cache_exceptions=(CardDeclined,)),
    ):
        raise CardDeclined(f"declined card {HOSTILE}")
    response = record_for(prefix, "acct_1", "POST", "/charges", "order-3")
    claimed = store.claim(response, "fp", heartbeat=False)
    # A header value holds no C0 control (a replay refuses one), but may hold obs-text, whose
    # C1 controls a terminal obeys: U+009B is CSI, "\x9b2J" clears the screen.
    stored = StoredResponse(201, (("X-Note", "4242\x9b2J\x9b31mFAKE"),), b"ok")
    assert store.complete(response, claimed.owner, encode_response(stored))  # type: ignore[union-attr]
    forged = record_for(prefix, "", GUARD_METHOD, "", "order-4")
    real_client.hset(forged.key, mapping={
        "state": "in_progress", "owner": HOSTILE, "fence": "1", f"s:{HOSTILE}": encode_value(1),
    })  # fmt: skip

    failure = idemkey("inspect", "order-2", "--guard", *_at(redis_url, prefix))
    headers = idemkey("inspect", "--digest", response.digest, *_at(redis_url, prefix))
    owner = idemkey("inspect", "order-4", "--guard", *_at(redis_url, prefix))
    for run in (failure, headers, owner):
        assert run.code == 0, run.err
        assert not any(c in run.out for c in "\x1b\r\x07\x9b"), repr(run.out)
        assert not any(line.startswith("released") for line in run.out.splitlines())
    for run in (failure, owner):
        assert "\\x1b[2J\\x1b[31mFAKE" in run.out  # shown escaped, not dropped
    assert ":CardDeclined: declined card 4242\\x1b[2J\\x1b[31mFAKE\\rforged" in failure.out
    assert "\\rforged line\\nreleased  OK\\x07" in failure.out
    assert "  X-Note: 4242\\x9b2J\\x9b31mFAKE\n" in headers.out
    assert "owner     4242\\x1b[2J...\n" in owner.out  # shortened to 8 characters, escaped
    assert "steps     1 finished: 4242\\x1b[2J" in owner.out
    # --json: the same escaped preview (as a response's), not the raw message.
    view = idemkey("inspect", "order-2", "--guard", "--json", *_at(redis_url, prefix))
    assert json.loads(view.out)["preview"] == failure.out.split("preview   ")[1].rstrip("\n")


@pytest.mark.parametrize("depth", [1_000, 100_000])
@pytest.mark.parametrize("kind", ["result", "failure", "response"])
def test_a_value_nested_too_deep_is_unreadable_and_forget_removes_it(
    idemkey: CliRunner,
    store: RedisStore,
    real_client: redis.Redis,
    redis_url: str,
    prefix: str,
    depth: int,
    kind: str,
) -> None:
    """A stored value nested past what msgpack decodes (written by anything but idemkey): inspect
    says the record is unreadable, and forget, the remedy for an unreadable record, deletes it,
    by key and by digest, even one a live claim holds (--force)."""
    nested = b"\x91" * depth + b"\xc0"  # [[[...[nil]...]]]
    value = {
        "result": b"\x01" + nested,
        "failure": b"\x03\x93\xa1t\xa1m\x81\xa1f" + nested,  # ["t", "m", {"f": nested}]
        "response": b"\x01\x93" + nested + b"\x90\xc4\x00",  # a status of [[...]]: no response
    }[kind]
    for key in ("deep-1", "deep-2"):
        with guard(store, key) as call:
            call.save({"x": 1})
        record = record_for(prefix, "", GUARD_METHOD, "", key)
        if kind == "response":  # an HTTP record's
            record = http_record(store, key)
        real_client.hset(record.key, "resp", value)

    by_key = ("--guard",) if kind != "response" else ("--scope", "acct_1", "--route", "/charges")
    shown = idemkey("inspect", "deep-1", *by_key, *_at(redis_url, prefix))
    assert shown.code == 0, shown.err
    assert f"stored    unreadable: stored {kind} is unreadable: " in shown.out
    if kind != "response":  # a response's status is no list: refused before any depth
        assert "maximum recursion depth" in shown.out

    forgot = idemkey("forget", "deep-1", *by_key, "--yes", "--force", *_at(redis_url, prefix))
    assert forgot.code == 0, forgot.err
    assert real_client.exists(record_for(prefix, *_name(kind), "deep-1").key) == 0
    digest = record_for(prefix, *_name(kind), "deep-2").digest
    forgot = idemkey("forget", "--digest", digest, "--yes", *_at(redis_url, prefix))
    assert forgot.code == 0, forgot.err
    assert real_client.exists(record_for(prefix, *_name(kind), "deep-2").key) == 0


def _name(kind: str) -> tuple[str, str, str]:
    """(scope, method, route) of the records the test above writes."""
    return ("acct_1", "POST", "/charges") if kind == "response" else ("", GUARD_METHOD, "")


def test_forget_and_cancel_never_decode_the_stored_value(
    idemkey: CliRunner,
    store: RedisStore,
    real_client: redis.Redis,
    redis_url: str,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever a value's decoding does (raise, for a format this version does not read, or a
    bug), forget and cancel need the state and the lease only: it never keeps an operator from
    removing a record."""
    from idemkey.cli import _records

    def broken(*args: object) -> None:
        raise RecursionError("maximum recursion depth exceeded while deserializing an object")

    monkeypatch.setattr(_records, "_decode_stored", broken)
    record = http_record(store, "order-5")
    inspected = idemkey("inspect", "--digest", record.digest, *_at(redis_url, prefix))
    assert inspected.code == 70  # inspect decodes, and fails as told
    run = idemkey("forget", "--digest", record.digest, "--yes", *_at(redis_url, prefix))
    assert run.code == 0, run.err
    assert real_client.exists(record.key) == 0
    with contextlib.suppress(RuntimeError), guard(store, "job-5") as call:
        call.step("reserve", lambda: 1)
        raise RuntimeError("after a step")  # released with a step: something to cancel
    run = idemkey("cancel", "job-5", "--guard", "--yes", *_at(redis_url, prefix))
    assert run.code == 0, run.err


def test_inspect_previews_the_head_of_an_unreadable_response_escaped(
    idemkey: CliRunner, store: RedisStore, real_client: redis.Redis, redis_url: str, prefix: str
) -> None:
    # A head 0.3 stored as the app sent it (a Trailers line, a control character): the replay
    # answers 503 record_unreadable; inspect shows the lines, so the operator sees which one,
    # escaped (no escape sequence reaches the terminal) and bounded.
    record = http_record(store, "order-h")
    headers = (
        ("Content-Type", "application/json"),
        ("Trailers", "X-Sum"),
        ("X-Note", "42\x1b[2J\x01" + "z" * 500),
        *((f"X-{n}", "v") for n in range(40)),
    )
    head = StoredResponse(201, headers, b"{}", reason="Created\x1b[31m")
    real_client.hset(record.key, "resp", encode_response(head))
    run = idemkey(
        "inspect", "order-h", "--scope", "acct_1", "--route", "/charges", *_at(redis_url, prefix)
    )
    assert run.code == 0, run.err
    assert "stored    unreadable: stored response is unreadable: " in run.out
    assert "  201 Created\\x1b[31m\n" in run.out
    assert "  Trailers: X-Sum\n" in run.out
    assert "  X-Note: 42\\x1b[2J\\x01zzz" in run.out
    assert "\x1b" not in run.out
    assert "\x01" not in run.out
    head = [line for line in run.out.splitlines() if line.startswith("  ")]
    assert len(head) == 21  # 20 lines, then how many more
    assert max(len(line) for line in head) < 130  # each cut, as a preview is
    assert "  ... 24 more lines\n" in run.out
