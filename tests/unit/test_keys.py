"""Idempotency-Key parsing and record naming, without Redis.

Header values are client input: any value either yields a valid key or an InvalidKeyError,
never another exception. Record names keep raw keys out of Redis key names and out of the
hash tag, so both keys of a record land in one cluster slot whatever the client sends.
"""

from __future__ import annotations

import re

import fakeredis
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from redis.crc import key_slot

from idemkey import InvalidKeyError, RedisStore, guard
from idemkey.records import MAX_KEY_LENGTH, parse_key, record_for

PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))
# A comma is refused in both forms (servers join two field lines with one).
printable_keys = st.text(alphabet=PRINTABLE.replace(",", ""), min_size=1, max_size=MAX_KEY_LENGTH)


def sf_string(key: str) -> str:
    """Serialize ``key`` as an RFC 8941 sf-string (escape backslash and double quote)."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def is_valid_key(key: str) -> bool:
    return (
        1 <= len(key) <= MAX_KEY_LENGTH
        and all(0x20 <= ord(c) <= 0x7E for c in key)
        and ("," not in key)
    )


# ---- examples ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ("abc", "abc"),
        ('"abc"', "abc"),
        ("  abc\t", "abc"),
        ('\t"abc" ', "abc"),
        ('"a b"', "a b"),  # spaces are allowed inside an sf-string
        (r'"a\"b"', 'a"b'),
        (r'"a\\b"', "a\\b"),
        (r'"\\\""', '\\"'),
        ("8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ("k" * MAX_KEY_LENGTH, "k" * MAX_KEY_LENGTH),
        ('"' + "k" * MAX_KEY_LENGTH + '"', "k" * MAX_KEY_LENGTH),
    ],
)
def test_valid_keys(value: str, key: str) -> None:
    assert parse_key(value) == key


def test_quoted_and_bare_forms_give_the_same_key() -> None:
    assert parse_key('"abc"') == parse_key("abc") == "abc"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ('""', "empty"),
        ("k" * (MAX_KEY_LENGTH + 1), "longer than 255"),
        ('"' + "k" * (MAX_KEY_LENGTH + 1) + '"', "longer than 255"),
        ("caf\u00e9", "ASCII"),
        ('"caf\u00e9"', "ASCII"),
        ("\u2603", "ASCII"),
        ("a\x00b", "visible ASCII"),
        ("a\x7fb", "visible ASCII"),
        ('"a\nb"', "RFC 8941"),
        ("a,b", "commas"),  # several field lines joined into one
        ('"a", "b"', "RFC 8941"),
        ("a b", "spaces"),
        ('"abc', "RFC 8941"),
        ('"abc"x', "RFC 8941"),
        (r'"a\b"', "RFC 8941"),  # only \" and \\ are escapes
        ('"a"b"', "RFC 8941"),
    ],
)
def test_invalid_keys(value: str, reason: str) -> None:
    with pytest.raises(InvalidKeyError, match=reason) as exc:
        parse_key(value)
    assert reason in exc.value.reason
    assert isinstance(exc.value, ValueError)  # callers that catch ValueError still work


def test_strict_header_requires_the_quoted_form() -> None:
    assert parse_key('"abc"', strict=True) == "abc"
    with pytest.raises(InvalidKeyError, match="double quotes"):
        parse_key("abc", strict=True)


def test_the_error_message_never_echoes_the_key() -> None:
    secret = "sk_live_" + "x" * 300
    with pytest.raises(InvalidKeyError) as exc:
        parse_key(secret)
    assert "sk_live_" not in str(exc.value)


# ---- properties --------------------------------------------------------------------------------


@given(st.text())
@example("\ud800")  # a lone surrogate, as a WSGI server may hand over after decoding
@example('"\\')
@example('"')
def test_any_value_gives_a_valid_key_or_invalid_key_error(value: str) -> None:
    for strict in (False, True):
        try:
            key = parse_key(value, strict=strict)
        except InvalidKeyError:
            continue
        assert is_valid_key(key)


@given(st.text(alphabet=PRINTABLE + '\\",\t', max_size=300))
def test_printable_values_give_a_valid_key_or_invalid_key_error(value: str) -> None:
    # Mostly near-valid input, to reach the sf-string and bare-form branches often.
    for strict in (False, True):
        try:
            key = parse_key(value, strict=strict)
        except InvalidKeyError:
            continue
        assert is_valid_key(key)


@given(printable_keys)
def test_every_valid_key_round_trips_through_an_sf_string(key: str) -> None:
    assert parse_key(sf_string(key)) == key
    assert parse_key(sf_string(key), strict=True) == key


@given(st.text(alphabet=PRINTABLE.replace(" ", "").replace(",", ""), min_size=1, max_size=255))
def test_bare_and_quoted_forms_agree(key: str) -> None:
    if key.startswith('"'):
        return  # a leading quote makes it the sf-string form
    assert parse_key(key) == parse_key(sf_string(key)) == key


@given(st.text(min_size=MAX_KEY_LENGTH + 1, alphabet=PRINTABLE))
def test_long_keys_are_rejected(key: str) -> None:
    with pytest.raises(InvalidKeyError):
        parse_key(sf_string(key))


# ---- records and slots -------------------------------------------------------------------------

HOSTILE_KEYS = ["}x", "{a}", "{", "}", "{}", "a{b}c", "k" * MAX_KEY_LENGTH, ":lock", "*", "\\"]


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_hostile_keys_keep_both_record_keys_in_one_slot(key: str) -> None:
    record = record_for("idemkey", "tenant", "POST", "/charges", parse_key(key))
    assert key_slot(record.key.encode()) == key_slot(record.lock.encode())
    assert key_slot(record.key.encode()) == key_slot(record.digest.encode())
    if len(key) > 2:  # "{" and "}" sit in every name, around the digest
        assert key not in record.key.removeprefix("idemkey:")
    assert record.key == f"idemkey:{{{record.digest}}}"
    assert record.lock == record.key + ":lock"


@given(
    prefix=st.text(alphabet=PRINTABLE.replace("{", "").replace("}", ""), min_size=1, max_size=20),
    scope=st.text(max_size=20),
    key=printable_keys,
)
def test_any_key_keeps_both_record_keys_in_one_slot(prefix: str, scope: str, key: str) -> None:
    record = record_for(prefix, scope, "POST", "/r", key)
    assert key_slot(record.key.encode()) == key_slot(record.lock.encode())
    # Lowercase hex only: nothing the client chose sits in the braces.
    assert re.fullmatch(r"[0-9a-f]{32}", record.digest), record.digest
    assert record.key == f"{prefix}:{{{record.digest}}}"


@pytest.mark.parametrize("key", ["caf\u00e9", "\u2603", "\x00", "a\u200bb"])
def test_unicode_and_control_keys_are_rejected_before_a_record_is_named(key: str) -> None:
    with pytest.raises(InvalidKeyError):
        parse_key(key)


def test_the_empty_key_is_rejected_by_guard() -> None:
    store = RedisStore(fakeredis.FakeRedis())
    with pytest.raises(InvalidKeyError), guard(store, ""):
        pytest.fail("the body must not run")


def test_records_are_separated_by_scope_method_route_and_key() -> None:
    base = ("p", "tenant", "POST", "/charges", "k1")
    names = {record_for(*base).digest}
    for index, other in enumerate(["tenant2", "PATCH", "/refunds", "k2"], start=1):
        variant = list(base)
        variant[index] = other
        names.add(record_for(*variant).digest)
    assert len(names) == 5
    assert record_for(*base) == record_for(*base)


def test_length_prefixing_keeps_field_boundaries() -> None:
    # "ab"+"c" and "a"+"bc" must not name the same record.
    assert record_for("p", "ab", "POST", "c", "k") != record_for("p", "a", "POST", "bc", "k")
    assert record_for("p", "s", "POST", "/r:", "k") != record_for("p", "s", "POST", "/r", ":k")


@pytest.mark.parametrize("codepoint", range(0x180))
def test_a_bare_key_is_visible_ascii_without_a_comma(codepoint: int) -> None:
    # The bare form's grammar, [\x21-\x2b\x2d-\x7e]+, checked without a regex engine: every
    # character alone, between two letters and repeated answers as the grammar says.
    char = chr(codepoint)
    allowed = 0x21 <= codepoint <= 0x7E and char != ","
    for value in (char, f"a{char}b", char * 3):
        if value.strip(" \t").startswith('"'):
            continue  # the quoted form: its own tests
        if allowed and value.strip(" \t"):
            assert parse_key(value) == value.strip(" \t")
        else:
            with pytest.raises(InvalidKeyError):
                parse_key(value)
