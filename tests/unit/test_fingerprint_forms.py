"""Sans-IO: how ``Exchange.fingerprint`` compares bodies (``Policy.fingerprint``), the
multipart and JSON canonical forms, and the comma rule of ``parse_key``."""

from __future__ import annotations

import httpx
import pytest

from idemkey import Policy
from idemkey._core import fingerprint, parse_key
from idemkey.errors import ConfigurationError, InvalidKeyError
from idemkey.http import Exchange, Headers, Request, begin
from idemkey.http._canonical import canonical_json, multipart_form


def exchange(policy: Policy, headers: list[tuple[str, str]]) -> Exchange:
    step = begin(policy, Request("POST", "/up", "", Headers([("Idempotency-Key", "k"), *headers])))
    assert isinstance(step, Exchange)
    return step


def httpx_multipart(
    files: dict[str, tuple[str, bytes, str]], data: dict[str, str]
) -> tuple[str, bytes]:
    """A multipart body as httpx builds it, with its fresh random boundary."""
    request = httpx.Request("POST", "http://x/up", files=files, data=data)
    return request.headers["content-type"], request.read()


FILES = {"receipt": ("r.txt", b"line\r\n--not-a-boundary\r\n", "text/plain")}


def test_multipart_is_compared_by_parts_not_boundary() -> None:
    policy = Policy()
    (ct1, b1), (ct2, b2) = (httpx_multipart(FILES, {"amount": "10"}) for _ in range(2))
    assert ct1 != ct2
    assert b1 != b2
    assert exchange(policy, [("Content-Type", ct1)]).fingerprint(b1) == exchange(
        policy, [("Content-Type", ct2)]
    ).fingerprint(b2)


@pytest.mark.parametrize(
    ("files", "data"),
    [
        ({"receipt": ("r.txt", b"other", "text/plain")}, {"amount": "10"}),
        ({"receipt": ("s.txt", FILES["receipt"][1], "text/plain")}, {"amount": "10"}),
        ({"receipt": ("r.txt", FILES["receipt"][1], "text/csv")}, {"amount": "10"}),
        ({"invoice": FILES["receipt"]}, {"amount": "10"}),
        (FILES, {"amount": "11"}),
        (FILES, {}),
    ],
)
def test_multipart_parts_that_differ_are_another_request(
    files: dict[str, tuple[str, bytes, str]], data: dict[str, str]
) -> None:
    policy = Policy()
    ct1, b1 = httpx_multipart(FILES, {"amount": "10"})
    ct2, b2 = httpx_multipart(files, data)
    assert exchange(policy, [("Content-Type", ct1)]).fingerprint(b1) != exchange(
        policy, [("Content-Type", ct2)]
    ).fingerprint(b2)


@pytest.mark.parametrize(
    "body",
    [
        b"no delimiter at all",
        b"--B\r\ncontent-disposition: form-data; name=a\r\n\r\nx",  # no close delimiter
        b"--B\r\nno-colon-header\r\n\r\nx\r\n--B--",
        b"--B\r\ncontent-type: text/plain\r\n\r\nx\r\n--B--",  # no Content-Disposition
        b"--Bjunk\r\ncontent-disposition: form-data; name=a\r\n\r\nx\r\n--B--",
    ],
)
def test_malformed_multipart_is_compared_as_bytes(body: bytes) -> None:
    assert multipart_form("multipart/form-data; boundary=B", body) is None


def test_multipart_parser_reads_quoted_params_preamble_and_epilogue() -> None:
    body = (
        b'preamble\r\n--B\r\nContent-Disposition: form-data; name="a\\"b"; filename=f.txt\r\n'
        b"Content-Type: text/plain\r\n\r\nhello\r\n--B\r\ncontent-disposition: form-data; "
        b"name=c\r\n\r\n\r\n--B--\r\nepilogue"
    )
    parts = multipart_form('multipart/form-data; boundary="B"', body)
    assert parts == b'3:a"b5:f.txt-10:text/plain5:hello' + b"1:c---0:"
    assert multipart_form("multipart/form-data", body) is None  # no boundary


def test_content_encoding_is_part_of_the_fingerprint() -> None:
    plain = fingerprint("POST", "/", "", "application/json", b"x")
    assert fingerprint("POST", "/", "", "application/json", b"x", "gzip") != plain
    assert fingerprint("POST", "/", "", "application/json", b"x", "") == plain


def test_canonical_json() -> None:
    assert canonical_json(b'{ "b": [1, {"d": 2, "c": 3}], "a": "\\u00e9" }') == (
        b'{"a":"\\u00e9","b":[1,{"c":3,"d":2}]}'
    )
    assert canonical_json(b'{"a": 1, "a": 2}') is None  # parsers disagree on which value wins
    assert canonical_json(b"amount=10") is None
    assert canonical_json(b"\xff\xfe{") is None


def test_json_mode_compares_json_values_and_non_json_as_bytes() -> None:
    policy = Policy(fingerprint="json")
    headers = [("Content-Type", "application/json")]
    a = exchange(policy, headers).fingerprint(b'{"a": 1, "b": 2}')
    assert exchange(policy, headers).fingerprint(b'{"b":2,"a":1}') == a
    assert exchange(policy, headers).fingerprint(b'{"b":2,"a":2}') != a
    assert exchange(policy, headers).fingerprint(b"a=1") != exchange(policy, headers).fingerprint(
        b"a=2"
    )
    # The default compares bytes.
    assert exchange(Policy(), headers).fingerprint(b'{"b":2,"a":1}') != exchange(
        Policy(), headers
    ).fingerprint(b'{"a": 1, "b": 2}')


@pytest.mark.parametrize(
    ("sent", "retried"),
    [
        (b'{"amount": 12345678901234567.89}', b'{"amount": 12345678901234567.00}'),
        (b'{"amount": 0.30000000000000001}', b'{"amount": 0.3}'),
        (b'{"amount": 1e400}', b'{"amount": 2e400}'),  # both past a double's range
    ],
)
def test_json_mode_never_equates_numbers_a_double_cannot_tell_apart(
    sent: bytes, retried: bytes
) -> None:
    # An app reading money with parse_float=Decimal sees two amounts: another request (422).
    policy = Policy(fingerprint="json")
    headers = [("Content-Type", "application/json")]
    first = exchange(policy, headers).fingerprint(sent)
    assert exchange(policy, headers).fingerprint(retried) != first
    assert exchange(policy, headers).fingerprint(sent) == first
    # Numbers a double holds exactly still compare as values, whatever their spelling.
    assert canonical_json(b'{"b": 1.50, "a": 1E2}') == b'{"a":100.0,"b":1.5}'


def test_callable_mode() -> None:
    seen: list[tuple[str, bytes]] = []

    def form(request: Request, body: bytes) -> str:
        seen.append((request.path, body))
        return body.decode().split(";")[0]

    policy = Policy(fingerprint=form)
    assert exchange(policy, []).fingerprint(b"a;1") == exchange(policy, []).fingerprint(b"a;2")
    assert exchange(policy, []).fingerprint(b"a;1") != exchange(policy, []).fingerprint(b"b;1")
    assert seen[0] == ("/up", b"a;1")
    bad = Policy(fingerprint=lambda request, body: 42)  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigurationError, match="bytes or str"):
        exchange(bad, []).fingerprint(b"")


def test_fingerprint_option_is_validated() -> None:
    with pytest.raises(ConfigurationError, match="fingerprint"):
        Policy(fingerprint="xml")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ['"x,y"', '"x, y"', "x,y", '"a,"'])
def test_a_comma_is_refused_in_both_forms(value: str) -> None:
    with pytest.raises(InvalidKeyError):
        parse_key(value)
