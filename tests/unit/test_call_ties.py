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


def test_a_committed_row_says_which_result_is_still_to_be_recorded_into_it() -> None:
    """``unrecorded_fence``: a row committed with no result (a step's, or the call's own
    before anything was saved) gets it before Redis; ``outdated_fence``: the call's own row
    lacks the result the record completes with (none in it, or a value saved over since)."""
    call = claimed()
    assert call.unrecorded_fence() is call.unrecorded_fence("charge") is None
    assert call.outdated_fence(b"any") is None  # no fenced row at all
    call._row_committed("charge", 7, None)
    assert call.unrecorded_fence("charge") == 7
    assert call.unrecorded_fence() is None  # the call's own row did not commit
    call._row_committed(None, 7, None)
    assert call.unrecorded_fence() == 7
    assert call.outdated_fence(b"saved later") == 7
    kept = claimed()
    kept._row_committed(None, 8, b"in the commit")
    assert kept.unrecorded_fence() is None
    assert kept.outdated_fence(b"in the commit") is None
    assert kept.outdated_fence(b"saved over it") == 8


def test_save_not_kept_completes_as_result_not_kept_without_raising() -> None:
    """What an integration whose result its own rules refuse records (an MCP tool result
    outside its schema, a Celery result JSON would not give back): as ``save()`` of a value
    msgspec cannot encode, without the error; the same misuse errors as ``save()``."""
    from idemkey._codec import RESULT_NOT_KEPT
    from idemkey.errors import ResultNotStorableError, UsageError

    call = claimed()
    call.save("first")
    call.save_not_kept()
    assert call._final() == RESULT_NOT_KEPT
    with pytest.raises(NoResultError):
        _ = call.result
    unencodable = claimed()
    with pytest.raises(ResultNotStorableError):
        unencodable.save(object())
    assert unencodable._final() == call._final()
    with pytest.raises(UsageError, match="replayed"):
        Call(replayed=True, result=1).save_not_kept()
    call._exited = True
    with pytest.raises(UsageError, match="after the guard's block has exited"):
        call.save_not_kept()
