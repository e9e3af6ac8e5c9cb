"""The sans-IO rules of recovery points (``idemkey.guard._steps``), without Redis."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from idemkey import ConfigurationError, LeaseLostError, StoreError
from idemkey._core import Claimed, decode_checkpoint_reply, decode_claim_reply
from idemkey.guard import _steps
from idemkey.guard._failures import rules_for
from idemkey.guard._steps import MAX_STEP_NAME, StepBook, check_step_name, step_field, step_key


def test_a_finished_step_is_returned_and_not_run_again() -> None:
    book = StepBook(fence=2, finished=[("reserve", b"r")])
    assert book.resumed == ("reserve",)
    assert book.begin("reserve") == b"r"
    assert book.begin("charge") is None  # run it
    book.finish("charge", b"c")
    assert book.begin("charge") == b"c"
    assert book.resumed == ("reserve",)  # ours are not "resumed"


def test_a_remembered_failure_is_finished_but_did_no_work() -> None:
    rules = rules_for((ValueError,))
    assert rules is not None
    declined = rules.encode(ValueError("declined"))
    assert declined is not None
    book = StepBook(fence=2, finished=[("reserve", b"\x01r"), ("quote", declined)])
    book.begin("charge")
    book.finish("charge", declined)
    assert book.finished == ("reserve", "quote", "charge")
    assert book.worked == ("reserve",)


def test_a_step_that_failed_may_run_again() -> None:
    book = StepBook(fence=1)
    assert book.begin("charge") is None
    book.abandon("charge")
    assert book.begin("charge") is None


def test_one_name_cannot_run_twice_at_once_but_two_names_can() -> None:
    book = StepBook(fence=1)
    assert book.begin("a") is None
    assert book.begin("b") is None
    with pytest.raises(RuntimeError, match="already running"):
        book.begin("a")


def test_after_a_lost_checkpoint_no_step_starts_even_a_finished_one() -> None:
    book = StepBook(fence=3, finished=[("reserve", b"r")])
    assert book.begin("charge") is None
    error = book.lose("charge")
    assert isinstance(error, LeaseLostError)
    assert error.fence == 3
    for name in ("charge", "ship", "reserve"):
        with pytest.raises(LeaseLostError):
            book.begin(name)


def test_no_step_starts_after_the_block() -> None:
    book = StepBook(fence=1)
    book.close()
    with pytest.raises(RuntimeError, match="exited"):
        book.begin("a")


def test_the_name_is_checked_first() -> None:
    book = StepBook(fence=1)
    book.close()
    with pytest.raises(ConfigurationError):
        book.begin("")


@pytest.mark.parametrize("name", ["a", "charge card", "x" * MAX_STEP_NAME, "réserver", "s:x"])
def test_good_names(name: str) -> None:
    assert check_step_name(name) == name
    assert step_field(name) == "s:" + name


@pytest.mark.parametrize("name", ["", "x" * (MAX_STEP_NAME + 1), "a\tb", "\x00", "\ud800", 1, None])
def test_bad_names(name: object) -> None:
    with pytest.raises(ConfigurationError):
        check_step_name(name)


def test_step_keys_depend_on_record_and_name_only() -> None:
    assert step_key("d1", "charge") == step_key("d1", "charge")
    assert step_key("d1", "charge") != step_key("d2", "charge")
    assert step_key("d1", "charge") != step_key("d1", "ship")
    # No ambiguity between a digest ending and a name beginning.
    assert step_key("d1", "a") != step_key("d", "1a")


def test_a_claim_reply_carries_the_finished_steps() -> None:
    reply = [1, 4, 1, b"reserve", b"\x01r", b"charge", b"\x01c"]
    decision = decode_claim_reply(reply, "me")
    assert decision == Claimed("me", 4, True, (("reserve", b"\x01r"), ("charge", b"\x01c")))
    assert decode_claim_reply([1, 1, 0], "me") == Claimed("me", 1, False)


@pytest.mark.parametrize(
    "reply", [[1, 4, 1, b"reserve"], [1, 4, 1, b"reserve", 7], [1, 4, 1, 5, b"x"]]
)
def test_a_malformed_claim_reply_is_a_store_error(reply: list[object]) -> None:
    with pytest.raises(StoreError):
        decode_claim_reply(reply, "me")


def test_a_checkpoint_reply_names_the_stored_result() -> None:
    assert decode_checkpoint_reply(1, b"ours") == b"ours"
    assert decode_checkpoint_reply(b"first", b"ours") == b"first"  # stored before: it stays
    assert decode_checkpoint_reply(0, b"ours") is None  # not our record
    with pytest.raises(StoreError):
        decode_checkpoint_reply([1], b"ours")


def test_the_rules_module_does_no_io() -> None:
    """``_steps`` is sans-IO, as its docstring says: the attempt runners (a task's, a thread's)
    live in ``_async_attempt`` / ``_sync_attempt`` (63d3937 held both here)."""
    tree = ast.parse(Path(_steps.__file__).read_text("utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add("." * node.level + (node.module or ""))
    waits = {"asyncio", "time", "threading", "socket", "inspect"}
    assert not imported & waits
    assert not [name for name in imported if "store" in name or "_async_" in name]
    assert not [node.name for node in ast.walk(tree) if isinstance(node, ast.AsyncFunctionDef)]
