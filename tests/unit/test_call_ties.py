"""The I/O-free rule behind fenced SQL results: what a Call completes with, given its ties.

``contrib.sqlalchemy`` reports each fenced transaction's outcome on a ``Tie``; ``Call._final()``
is what the guard completes with (None: release). No Redis, no database.
"""

from __future__ import annotations

import pytest

from idemkey.errors import NoResultError
from idemkey.guard import Call


def claimed() -> Call[object]:
    return Call(replayed=False, fence=1, key="k")


def test_an_untied_call_completes_with_what_it_saved() -> None:
    call = claimed()
    assert call._final() is None
    call.save("done")
    assert call._final() is not None  # save() then an exception still completes


@pytest.mark.parametrize("save_first", [True, False])
def test_a_rolled_back_tie_drops_the_value_saved_before_it(save_first: bool) -> None:
    call = claimed()
    if save_first:
        call.save("charge-1")
    tie = call._tie()
    if not save_first:
        call.save("charge-1")
    assert call._final() is None  # still open: not committed yet
    tie.rolled_back()
    assert call._final() is None
    with pytest.raises(NoResultError):
        _ = call.result
    call.save("after")  # a new decision after the rollback counts again
    assert call._final() is not None


def test_a_committed_tie_keeps_its_value_through_a_later_rollback() -> None:
    call = claimed()
    first = call._tie()
    call.save("charge-1")
    first.committed()
    saved = call._final()
    assert saved is not None
    second = call._tie()  # e.g. a step fenced afterwards, which rolls back
    second.rolled_back()
    assert call._final() == saved
    assert call.result == "charge-1"


def test_a_refusal_drops_an_unkept_value() -> None:
    call = claimed()
    call.save("charge-2")
    call._tie()
    call._refused()
    with pytest.raises(NoResultError):
        _ = call.result


def test_a_committing_tie_counts_as_committed_unless_its_commit_failed() -> None:
    call = claimed()
    tie = call._tie()
    call.save("charge-3")
    tie.committing()  # a Connection's COMMIT was sent
    assert call._final() is not None  # it returned: committed
    failed = claimed()
    tie = failed._tie()
    failed.save("charge-4")
    tie.committing()
    tie.rolled_back()  # handle_error: the COMMIT failed
    tie.rolled_back()  # and its connection's rollback: reported twice, ends once
    assert failed._final() is None
