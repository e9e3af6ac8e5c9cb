"""``idemkey probe -H`` given something that is not ``'Name: value'``: the error says what is
wrong without printing the argument, which is often a credential (``-H 'Authorization Bearer
xyz'``, its colon left out); at most the header name it starts with is named.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cli.conftest import CliRunner

URL = "http://127.0.0.1:1/charges"  # never reached: the arguments are refused first
CHARGE = '{"amount": 1000, "currency": "eur"}'
SECRET = "sk_live_7Hq2xZ9w"


@pytest.mark.parametrize(
    ("header", "named"),
    [
        (f"Authorization Bearer {SECRET}", "Authorization"),  # the colon left out
        (f"Authorization Basic {SECRET}:{SECRET}", "Authorization"),  # a colon in the value
        (f"Authorization\tBearer {SECRET}", "Authorization"),
        (f"Bearer {SECRET}", "Bearer"),  # the name left out
        (SECRET, None),  # the value alone: no name to tell
        (f"{SECRET}/{SECRET}==", None),  # base64, '/' and '=' are not in a header name
        (f": {SECRET}", None),  # no name before the colon
        (f"X Api Key: {SECRET}", "X"),  # spaces in the name
    ],
)
@pytest.mark.parametrize("option", ["-H", "--other-tenant-header"])
def test_a_malformed_header_is_refused_without_printing_it(
    idemkey: CliRunner, header: str, named: str | None, option: str
) -> None:
    run = idemkey("probe", URL, "-d", CHARGE, option, header)
    assert run.code == 2, run.out + run.err
    assert run.out == ""
    assert len(run.err.splitlines()) == 1, run.err
    assert SECRET not in run.err
    assert SECRET[:6] not in run.err
    assert run.err.startswith(f"idemkey probe: {option} must look like 'Name: value'"), run.err
    if named is not None:
        assert f"'{named}'" in run.err, run.err
    run = idemkey("probe", URL, "-d", CHARGE, option, header, "--json")
    assert run.code == 2
    assert SECRET[:6] not in run.err
    assert json.loads(run.err)["exit_code"] == 2


def test_the_error_says_what_is_missing(idemkey: CliRunner) -> None:
    no_colon = idemkey("probe", URL, "-d", CHARGE, "-H", f"Authorization Bearer {SECRET}")
    assert "no ':'" in no_colon.err, no_colon.err
    no_name = idemkey("probe", URL, "-d", CHARGE, "-H", f": {SECRET}")
    assert "no header name" in no_name.err, no_name.err
    spaced = idemkey("probe", URL, "-d", CHARGE, "-H", f"X Api Key: {SECRET}")
    assert "a space before its first ':'" in spaced.err, spaced.err
    odd = idemkey("probe", URL, "-d", CHARGE, "-H", f"X(Api): {SECRET}")
    assert "a character before its first ':'" in odd.err, odd.err


def test_a_mistyped_authorization_header_stays_off_the_terminal() -> None:
    """As an operator runs it: ``python -m idemkey probe ... -H 'Authorization Bearer ...'``."""
    argv = ["probe", URL, "-d", CHARGE, "-H", "Accept: */*", "-H", f"Authorization Bearer {SECRET}"]
    run = subprocess.run(
        [sys.executable, "-m", "idemkey", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    assert SECRET not in run.stderr
    assert "-H must look like 'Name: value'" in run.stderr
    assert "'Authorization'" in run.stderr
